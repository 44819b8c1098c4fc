#!/usr/bin/env bash
# Run studies on the GPU machine in one go: install the carried wheels, execute each notebook with papermill
# (profile full) into book/studies/, run extra commands, and pack everything into $OUT/results.tgz.
#
#   scripts/gpu_run.sh [-t SECONDS_PER_STUDY] [-r REPEATS] STUDY[:SECONDS]... [-- EXTRA COMMAND...]
#
# -r N: each study runs N times, each a fresh process with seed base+r, and its verdicts are combined
# (servelab.studies.common.repeat_runs; N >= 3); the time limit then covers all N. 08_simulator runs once.
#
# PM_PARAMS="-p name value ..." adds papermill parameters to every study of the run.
# 08_simulator is not a study: its executed notebook becomes book/simulator.ipynb. Give the studies in the
# order of `make reproduce`'s STUDIES (each finds what it reads: 06 before 03, 01 before 08 before 02). 03 and 06
# share one trained model family through $SERVELAB_TRAINED (trained by whichever runs first).
#
# Logs go to $OUT/run.log; a one-line-per-study summary is printed last.
set -uo pipefail
# SERVELAB_SNAPSHOT=DIR: run from a clean export of a commit carried in DIR (an ignored folder): the working
# tree around it may hold unfinished edits; results are packed from DIR
if [ -n "${SERVELAB_SNAPSHOT:-}" ]; then
  here=$PWD; cd "$SERVELAB_SNAPSHOT" || exit 1
  [ -d "$here/.whl" ] && [ ! -e .whl ] && ln -s "$here/.whl" .whl
fi
per=300
repeats=1
while [ "${1:-}" = "-t" ] || [ "${1:-}" = "-r" ]; do
  if [ "$1" = "-t" ]; then per=$2; else repeats=$2; fi; shift 2
done
studies=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do studies+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
extra=("$@")
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log=$OUT/run.log
export SERVELAB_TRAINED=${SERVELAB_TRAINED:-/tmp/servelab_trained}
# the commit this tree is (written by the lead before the run): the copy's own .git may be stale
[ -f .revision ] && export SERVELAB_REVISION=$(cat .revision)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false  # no MPLBACKEND: notebooks need the inline backend
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed" | tee -a "$log"; exit 1; }
fi
export PYTHONPATH=/tmp/site:$PWD/lib
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv;
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } >>"$log" 2>&1
mkdir -p book/studies data/results
summary=$OUT/summary.txt; : >"$summary"
for spec in "${studies[@]}"; do
  s=${spec%%:*}; limit=$per; [ "$spec" != "$s" ] && limit=${spec#*:}
  dest=book/studies/$s.ipynb; [ "$s" = 08_simulator ] && dest=book/simulator.ipynb
  t0=$(date +%s)
  if [ "$repeats" -gt 1 ] && [ "$s" != 08_simulator ]; then
    timeout $(( limit * repeats )) python3 -m servelab.studies.common.repeat_runs "$s" --repeats "$repeats" \
        --profile full ${PM_PARAMS:-} --page "$dest" >>"$OUT/$s.log" 2>&1
  else
    timeout "$limit" python3 -m papermill --cwd notebooks "notebooks/$s.ipynb" "$dest" \
        -p profile full ${PM_PARAMS:-} --log-output --no-progress-bar >>"$OUT/$s.log" 2>&1
  fi
  rc=$?
  echo "$s rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$summary" >>"$log"
  grep -E "PapermillExecutionError|Error|error" "$OUT/$s.log" | tail -5 >>"$summary" || true
done
if [ ${#extra[@]} -gt 0 ]; then
  t0=$(date +%s)
  timeout "$per" bash -c "${extra[*]}" >>"$OUT/extra.log" 2>&1
  echo "extra rc=$? $(( $(date +%s) - t0 ))s: ${extra[*]}" | tee -a "$summary" >>"$log"
  tail -25 "$OUT/extra.log" >>"$summary"
fi
tar czf "$OUT/results.tgz" book/studies $(ls book/simulator.ipynb 2>/dev/null) data/results 2>>"$log"
ls -la "$OUT" >>"$log"
cat "$summary"
