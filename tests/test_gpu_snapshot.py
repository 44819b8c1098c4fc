"""``scripts/gpu_snapshot.sh``: a commit's clean export for gpu_run.sh, with only the named studies' results and no
pages (what the device carries beside the working tree must fit 64 MiB), and the commit in its ``.revision``."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "scripts" / "gpu_snapshot.sh"  # this checkout's, run in a clone of its commit


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists() or not shutil.which("git"), reason="needs the git repository")
def test_the_snapshot_holds_the_commits_code_and_only_the_named_studies_results(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-local", str(REPO_ROOT), str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True, check=True).stdout
    (clone / "lib" / "servelab" / "__init__.py").write_text("# an unfinished edit in the working tree\n")
    out = subprocess.run(["bash", str(SCRIPT), "HEAD", "08_simulator"], cwd=clone, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    snap = clone / ".gpu" / "snap"
    assert (snap / ".revision").read_text().strip() == head.strip()
    committed = subprocess.run(
        ["git", "show", "HEAD:lib/servelab/__init__.py"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout
    assert (snap / "lib" / "servelab" / "__init__.py").read_text() == committed  # the commit's, not the edit
    assert (snap / "scripts" / "gpu_run.sh").exists() and not (snap / "book").exists()
    kept = {p.name for p in (snap / "data" / "results").glob("*/*") if p.is_dir()}
    assert kept <= {"08_simulator"}
    bad = subprocess.run(["bash", str(SCRIPT), "HEAD"], cwd=clone, capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr
