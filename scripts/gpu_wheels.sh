#!/usr/bin/env bash
# Fill .whl/ with the wheels the GPU machine lacks, for the jobs make gpu-plan lists (run here, where the package
# registry is; the GPU machine has no network). scripts/gpu_run.sh installs them there, from the call that carries
# .whl (the plan names it).
#
#   scripts/gpu_wheels.sh
#
# fastapi, uvicorn and pydantic start the server (Studies 1, 7 and the simulator); gguf and accelerate load
# SmolLM2's GGUF. accelerate pulls torch's CUDA wheels (nvidia_*, 2.8 GB), which the image has already: they are
# taken out, with the other dependencies the image covers, so that .whl stays about 3.6 MB and rides beside a
# part of SmolLM2's weights within a call's 64 MiB (servelab.studies.common.carry counts it).
set -euo pipefail
fetch=../shared/gpu/fetch-wheels.sh
[ -x "$fetch" ] || { echo "gpu_wheels: $fetch not found (the shared GPU notes sit beside the checkout)" >&2; exit 1; }
"$fetch" fastapi uvicorn pydantic gguf accelerate
rm -f .whl/nvidia_*.whl .whl/opentelemetry*.whl .whl/truststore*.whl .whl/httpcore2*.whl .whl/httpx2*.whl
echo "$(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl: $(ls .whl | sed 's/-[0-9].*//' | tr '\n' ' ')"
