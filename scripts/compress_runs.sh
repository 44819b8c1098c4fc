#!/usr/bin/env bash
# Compress (xz) the large raw tables in the run folders given, or in every run of today's layout under data/results:
# Study 1's steps.csv and requests.csv (0.4-3.4 MB a run, a sixth of that in xz) and the simulator's fresh runs'
# fresh_steps.csv and fresh_requests.csv (about 10 MB a run), and the replicas runs' requests.csv (Beyond one GPU).
# Study 1's legacy run stays as the simulator's freeze hashed it; the held-out report hashes a fresh run's request records by their content, so either form gives one
# hash. Readers take either form (Run.file; pandas unpacks .xz). Why: each GPU call carries the tracked tree within
# 64 MiB, and Study 1's runs alone had grown it to 22 of its 34 MB, leaving no room for SmolLM2's weights. Where xz is missing, the tables stay as they are (compress them here before committing).
#
#   scripts/compress_runs.sh [RUN_DIR ...]
set -euo pipefail
command -v xz >/dev/null || { echo "compress_runs: no xz here; tables left uncompressed" >&2; exit 0; }
if [ $# -eq 0 ]; then
  mapfile -t dirs < <(find data/results \( -path '*/01_scheduling/runs/*/*/r*' -o -path '*/08_simulator/runs/*/fresh_*/r*' \
    -o -path '*/09_beyond_one_gpu/runs/*/*/r*' \) -type d -not -path '*/runs/legacy/*')
else
  dirs=("$@")
fi
for d in "${dirs[@]}"; do
  case $d in
    */01_scheduling/runs/legacy/*) continue ;;
    */01_scheduling/runs/*) tables=(steps.csv requests.csv) ;;
    */08_simulator/runs/*/fresh_*) tables=(fresh_steps.csv fresh_requests.csv) ;;
    */09_beyond_one_gpu/runs/*) tables=(requests.csv) ;;
    *) continue ;;
  esac
  for t in "${tables[@]}"; do
    f=$d/$t
    [ -f "$f" ] && xz -9 -T1 -f "$f"  # one thread: the same table gives the same bytes
  done
done
exit 0
