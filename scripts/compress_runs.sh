#!/usr/bin/env bash
# Compress (xz) Study 1's large raw tables (steps.csv, requests.csv: 0.4-3.4 MB a run, a sixth of that in xz) in
# the run folders given, or in every run of today's layout under data/results (the legacy run stays as the
# simulator's freeze hashed it). Readers take either form (Run.file; pandas unpacks .xz). Why: each GPU call carries
# the tracked tree within 64 MiB, and Study 1's runs alone had grown it to 22 of its 34 MB, leaving no room for
# SmolLM2's weights. Where xz is missing, the tables stay as they are (compress them here before committing).
#
#   scripts/compress_runs.sh [RUN_DIR ...]
set -euo pipefail
command -v xz >/dev/null || { echo "compress_runs: no xz here; tables left uncompressed" >&2; exit 0; }
if [ $# -eq 0 ]; then
  mapfile -t dirs < <(find data/results -path '*/01_scheduling/runs/*/*/r*' -type d -not -path '*/runs/legacy/*')
else
  dirs=("$@")
fi
for d in "${dirs[@]}"; do
  case $d in */01_scheduling/runs/legacy/*) continue ;; */01_scheduling/runs/*) ;; *) continue ;; esac
  for f in "$d/steps.csv" "$d/requests.csv"; do
    [ -f "$f" ] && xz -9 -T1 -f "$f"  # one thread: the same table gives the same bytes
  done
done
exit 0
