#!/usr/bin/env bash
# Build .gpu/snap, a clean export of commit REV for `SERVELAB_SNAPSHOT=.gpu/snap scripts/gpu_run.sh JOB ...`, so that a
# job measures the code it must measure while the working tree holds newer code: e.g. the simulator's fresh held-out
# repeats, which must run on the engine the freeze calibrated on (s08_simulator.measure.engine_check), after the engine
# moved on. The device carries the working tree and the carried paths in 64 MiB together, so the export keeps only the
# results of the studies named (a job reads its own study's earlier runs for its time estimate) and no pages.
#
#   scripts/gpu_snapshot.sh REV STUDY [STUDY ...]    # e.g. scripts/gpu_snapshot.sh 25aed3a 08_simulator
#
# then carry [".whl", ".revision", ".gpu"] and run `SERVELAB_SNAPSHOT=.gpu/snap scripts/gpu_run.sh JOB ...`; unpack the
# call's results.tgz at the repository root as for any other call.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/gpu_snapshot.sh REV STUDY [STUDY ...]" >&2; exit 2; }
rev=$(git rev-parse --verify "$1^{commit}"); shift
out=.gpu/snap
rm -rf "$out"; mkdir -p "$out"
git archive "$rev" | tar -x -C "$out"
rm -rf "$out/book" "$out/data/dev"
for dir in "$out"/data/results/*/*/; do
  [ -d "$dir" ] || continue
  name=$(basename "$dir")
  keep=
  for study in "$@"; do [ "$name" = "$study" ] && keep=1; done
  [ -n "$keep" ] || rm -rf "$dir"
done
echo "$rev" > "$out/.revision"
echo "$out: $rev, results of $*; $(du -sh "$out" | cut -f1)"
