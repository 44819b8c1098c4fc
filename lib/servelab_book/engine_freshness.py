"""Is an engine-page run's measuring code today's? Judged by the fingerprint its sidecar records
(``servelab.bench.jobs.stamp``), as the studies' pages judge their runs: the benchmark's table and the step budget
say so in one sentence, and `make gpu-plan` lists the job that measures them again."""

from __future__ import annotations

from servelab.bench.jobs import JOBS, STUDY
from servelab.measure.fingerprint import DIGITS, fingerprint
from servelab.studies.common.markdown import md_text

SHOWN = 6  # changed files named in the sentence; the rest are counted


def freshness(part: str, side: dict, what: str) -> str:
    """One sentence on the run of engine job ``part`` whose sidecar is ``side`` ("" where it recorded no
    fingerprint: the caller judges such a run by other means). ``what``: how the sentence names the data."""
    recorded = str(side.get("fingerprint") or "")
    if not recorded:
        return ""
    today = fingerprint(JOBS[part].module)
    commit = md_text(str(side.get("git_commit") or "unknown")[:12])
    if today.digest == recorded:
        short = today.digest[:DIGITS]
        return f"{what}'s measuring code is today's (fingerprint `{short}`, run at commit `{commit}`).\n"
    files = side.get("fingerprint_files") if isinstance(side.get("fingerprint_files"), dict) else {}
    changed = today.changed_since(files)
    shown = ", ".join(f"`{p.removeprefix('lib/servelab/')}`" for p in changed[:SHOWN])
    more = f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
    return (
        f"{what}'s measuring code has changed since its run at commit `{commit}` (fingerprint "
        f"`{recorded[:DIGITS]}`, today `{today.digest[:DIGITS]}`; changed: {shown}{more}): it describes that run's "
        f"engine until `make gpu-plan`'s `{STUDY}:{part}:0` runs again.\n"
    )
