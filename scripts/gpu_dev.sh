#!/usr/bin/env bash
# Development measurements on any sm90 GPU (an H100 the device tool lends when no H200 comes): nothing here is a
# book figure, so any card answers. Each task runs under its own time limit and writes its log (and CSVs) to $OUT.
#
#   scripts/gpu_dev.sh TASK [TASK ...]
#
#   gpu-quick      make gpu-test-quick: token-exactness of every captured path (goal: under 3 min on the H200)
#   gpu-full       the GPU tests not in the quick tier
#   staged         the GPU tests of the code staged for after the campaign: kernels/small_linear (and its RoPE
#                  epilogue), speculative/,
#                  Study 3's controlled sweep through the engine mode (s03_speculative/controlled_engine)
#   small-linear   scripts/bench_small_linear.py --sweep --rows 1: the fused linears against the engine's chain, every
#                  launch (block_n x warps) at batch 1
#   small-linear-split  the same at 1 row with the reduction split over programs too (split_k 2/4/8 at block_n
#                  4/16/64): does Qwen2-0.5B's down (896 outputs, 4,864 inputs) come nearer its floor?
#   small-linear-rows  the same at 1, 4 and 8 rows, default launch
#   pdl            small_linear with programmatic dependent launch: its GPU test (the same bits in a CUDA graph), the
#                  24-layer chain at 1 row with and without it, and an engine decode step at batch 1 and 4 both ways
#   decode-kernel  scripts/bench_decode_kernel.py: decode attention, one pass vs split-KV vs gather
#   decode-splits  the same at forced splits 1-16 over batches 1-128 and contexts 512-4,096, beside the splits the
#                  engine's decode graphs pick (decode_splits.csv): is the engine's split choice the fastest? Each
#                  split count runs under the device's measured launch and the fixed 64-key tile it replaced (5f422f8)
#   small-batch-step  scripts/bench_small_batch_step.py: an engine decode step at batch 1, 4 and 8 with its blocks
#                  through small_linear (models/small_batch.py) against the default and fused_rope_kv_write alone
#   spec-engine    the engine's speculative mode on the device (tests/test_engine_speculation.py, CPU and GPU tests)
#   small-batch-step-check  the same, Qwen2-0.5B at 1 and 8 rows, under the staged compile check on the first two
#                  blocks: does fused_rope_kv_write or small_linear pay once compiled, and small_linear with RoPE
#                  and the pool write in the qkv launch (five launches a layer, not six)?
#   spec-bench     scripts/bench_spec_engine.py: c, v and the speed-up at alpha 0.8, Llama-3-8B's shape with the 0.5B
#                  draft of its vocabulary, batch 1 and 8
#   spec-bench-launch  the same with the decode kernel's launch fixed at KEYS=128/4 warps/2 stages (the H100's
#                  fastest at small batches, decode-tuning) instead of the tuner's per-process pick
#   spec-bench-off  the same with fused_rope_kv_write and small_batch off in both engines (the default's "auto" turns
#                  them on on a GPU): what the fused step and the draft's one-row small_linear path take off c
#   spec-bench-seeds  the defaults, unprofiled, over 5 seeds' controlled draws: how much of the gap to Leviathan's
#                  prediction is the draws' luck, and how much time the formula does not price
#   spec-bench-rounds  the defaults, then again with each draft step in its own graph (--draft-rounds steps): what the
#                  round in one graph (engine/draft_rounds.py) takes off c, on one machine
#   long-tiles     scripts/bench_long_tiles.py: the staged long-tile kernel (kernels/triton_long_tiles.py) against
#                  triton_ragged's long tiles, a 4096-token prefill and a 512-token chunk after 2,048 (0.5B, 8B shapes)
#   long-tiles-64  the same with 64-token long tiles: a 512-token chunk makes 4 tiles of 128 a head, 56 programs at
#                  the 0.5B shape on 132 SMs, so a shorter tile may pay where the chunk reads a long context
#   decode-tuning  scripts/bench_decode_tuning.py in 3 fresh processes: every one-pass decode launch the tuner picks
#                  from, at 4 decode points and both model shapes, beside what the tuner picked in that process
#   spec-syncs     scripts/diag_spec_syncs.py: the stack of every host sync PyTorch's debug mode reports in a speculative
#                  step (two rounds of two sequences, a twin draft)
#   host-stalls    Study 1's two Qwen2-0.5B parts (repeat 0, on any GPU) under the stall probe
#                  (scripts/stall_probe: garbage collections, Triton and torch.compile compiles, stack samples in every
#                  process), then scripts/host_stalls.py: what each step held >= 50 ms on the host was doing; first,
#                  scripts/gc_pause.py: a full collection's pause in a process holding the Qwen2-0.5B engine. On the
#                  H200 such steps (380-531 ms) set F1.2's split repeat; the engine process never freezes its heap
#   ragged-tiles   scripts/bench_ragged_tiles.py: mixed steps' attention at packed tiles of 16, 8, 4 and 2 tokens, and
#                  with the decodes in packed tiles of their own (Qwen2-0.5B, bf16)
#   ragged-tiles-offline  scripts/bench_ragged_tiles_offline.py: the bench's offline workload (default budget and 512)
#                  with the step graphs' packed tiles of 16 and of 2 tokens, 3 interleaved runs each (Qwen2-0.5B)
#   step-budget    python -m servelab.bench.step_budget (Qwen2-0.5B): the engine:step_budget job's step kinds on this
#                  card, with each step kind's kernels (step_kernels.csv), into $OUT/step_budget
#   compile-probe  scripts/probe_compile_check.py: the compile check's refusals, rounding or fault (8B and 0.5B shapes:
#                  bf16 eager and compiled against the same weights in float32)
#
# Use it when scripts/gpu_run.sh refuses the card (exit 3):
#   scripts/gpu_run.sh JOBS || { rc=$?; [ $rc -ne 3 ] && exit $rc; scripts/gpu_dev.sh staged small-linear; }
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"  # exported: a task may run its commands in a child shell
export PYTHONPATH=$PWD/lib PYTHONUNBUFFERED=1 MPLBACKEND=Agg
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
run() {  # run TASK SECONDS COMMAND...: the command under a time limit, its output in $OUT/TASK.log
  local task=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$task.log" 2>&1
  local rc=$?
  echo "$task: exit $rc in $((SECONDS - t0)) s (limit $limit s)" | tee -a "$OUT/summary.txt"
  tail -25 "$OUT/$task.log"
}
GPU_TESTS=$(grep -l 'pytest\.mark\.gpu' tests/test_*.py)
for task in "$@"; do
  case "$task" in
    gpu-quick) run "$task" 240 make gpu-test-quick ;;
    gpu-full) run "$task" 560 python3 -m pytest -q -p no:cacheprovider --durations=15 -m "gpu and not gpu_quick" $GPU_TESTS ;;
    staged) run "$task" 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_small_linear.py tests/test_small_linear_rope_kv.py \
      tests/test_speculative_rejection.py tests/test_speculative_ngram.py tests/test_controlled_engine.py ;;
    small-linear) run "$task" 420 python3 scripts/bench_small_linear.py --out "$OUT/small_linear.csv" --sweep --rows 1 ;;
    small-linear-split) run "$task" 300 python3 scripts/bench_small_linear.py --out "$OUT/small_linear_split.csv" --sweep split --rows 1 ;;
    small-linear-rows) run "$task" 240 python3 scripts/bench_small_linear.py --out "$OUT/small_linear_rows.csv" ;;
    pdl) run "$task" 420 bash -c 'python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_small_linear.py -k pdl \
      && python3 scripts/bench_small_linear.py --out "$OUT/small_linear_pdl.csv" --pdl --rows 1 \
      && python3 scripts/bench_small_batch_step.py --out "$OUT/small_batch_step_pdl.csv" --shapes qwen2-0.5b --batch 1 4' ;;
    decode-kernel) run "$task" 180 python3 scripts/bench_decode_kernel.py ;;
    decode-splits) run "$task" 240 python3 scripts/bench_decode_kernel.py --sweep-splits --out "$OUT/decode_splits.csv" ;;
    small-batch-step-check) run "$task" 300 python3 scripts/bench_small_batch_step.py --shapes qwen2-0.5b --batch 1 8 --out "$OUT/small_batch_step_check.csv" ;;
    small-batch-step) run "$task" 360 python3 scripts/bench_small_batch_step.py --out "$OUT/small_batch_step.csv" ;;
    spec-engine) run "$task" 300 python3 -m pytest -q -p no:cacheprovider -x tests/test_engine_speculation.py ;;
    spec-bench) run "$task" 420 python3 scripts/bench_spec_engine.py --profile --out "$OUT/spec_engine.csv" ;;
    spec-bench-launch) run "$task" 420 python3 scripts/bench_spec_engine.py --decode-launch 128,4,2 --out "$OUT/spec_engine_launch.csv" ;;
    spec-bench-off) run "$task" 420 python3 scripts/bench_spec_engine.py --switches off --profile --out "$OUT/spec_engine_off.csv" ;;
    spec-bench-seeds) run "$task" 420 python3 scripts/bench_spec_engine.py --seeds 5 --out "$OUT/spec_engine_seeds.csv" ;;
    spec-bench-rounds) run "$task" 420 bash -c 'for r in graph steps; do python3 scripts/bench_spec_engine.py \
      --profile --draft-rounds $r --out "$OUT/spec_engine_rounds_$r.csv" || exit; done' ;;
    long-tiles) run "$task" 300 python3 scripts/bench_long_tiles.py --out "$OUT/long_tiles.csv" ;;
    long-tiles-64) run "$task" 300 python3 scripts/bench_long_tiles.py --long-tile-tokens 64 --out "$OUT/long_tiles_64.csv" ;;
    decode-tuning) run "$task" 420 bash -c 'for i in 0 1 2; do python3 scripts/bench_decode_tuning.py --process $i --out "$OUT/decode_tuning.csv" || exit; done' ;;
    spec-syncs) run "$task" 200 python3 scripts/diag_spec_syncs.py ;;
    host-stalls) run "$task" 560 bash -c '
      out=$1; stamp=$(mktemp); sleep 1
      if ls .whl/*.whl >/dev/null 2>&1; then  # the server needs fastapi and uvicorn, carried as wheels
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
      fi
      [ -f .revision ] && export SERVELAB_REVISION=$(cat .revision)
      mkdir -p "$out/probe"
      PYTHONPATH=/tmp/site:$PWD/lib python3 scripts/gc_pause.py --out "$out/gc_pause.csv"
      # the runs go to a results root of their own: under the probe they are no book data, and a tarball of
      # data/results/nvidia-h200/... unpacked at the repository root would overwrite the campaign repeat 0
      export SERVELAB_RESULTS=/tmp/stall_results
      SERVELAB_ANY_GPU=1 SERVELAB_STALL_PROBE="$out/probe/p" PYTHONPATH="$PWD/scripts/stall_probe:/tmp/site:$PWD/lib" \
        timeout 420 python3 -m servelab.studies.common.campaign run 01_scheduling:qwen-eager-chunked512:0 \
        01_scheduling:qwen-fcfs-chunked2048:0  # cut in time for the reading and the packing below
      runs=$(find /tmp/stall_results -path "*/01_scheduling/runs/*/r0" -type d -newer "$stamp" 2>/dev/null | sort)
      PYTHONPATH=/tmp/site:$PWD/lib python3 scripts/host_stalls.py $runs --probe "$out/probe/p" --out "$out/host_stalls.csv"
      tar cJf "$out/host_stalls_runs.tar.xz" $runs "$out/probe" 2>/dev/null; rm -rf "$out/probe"' _ "$OUT" ;;
    ragged-tiles) run "$task" 420 python3 scripts/bench_ragged_tiles.py --out "$OUT/ragged_tiles.csv" ;;
    ragged-tiles-offline) run "$task" 420 python3 scripts/bench_ragged_tiles_offline.py --out "$OUT/offline_tiles.csv" ;;
    step-budget) run "$task" 300 python3 -m servelab.bench.step_budget --model config:qwen2-0.5b --time-budget 240 \
      --out "$OUT/step_budget" ;;
    compile-probe) run "$task" 300 python3 scripts/probe_compile_check.py --out "$OUT/compile_check.csv" ;;
    *) echo "unknown task '$task' (see the header of $0)" | tee -a "$OUT/summary.txt"; exit 2 ;;
  esac
done
# The device tool brings back at most 8 files from $OUT (two folders down): past that, every file but the summary
# and gpu.txt travels in one tarball (on 2026-12-07 step_kernels.csv stayed behind so, the 9th of 10 files).
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && find . -type f ! -name summary.txt ! -name gpu.txt ! -name dev.tgz | sort >/tmp/dev_files.txt &&
    tar czf dev.tgz -T /tmp/dev_files.txt && xargs -a /tmp/dev_files.txt rm -f && find . -mindepth 1 -type d -empty -delete)
  echo "packed $(wc -l </tmp/dev_files.txt) files into \$OUT/dev.tgz (the device tool returns 8 at most)" | tee -a "$OUT/summary.txt"
fi
