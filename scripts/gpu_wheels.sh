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
# part of SmolLM2's weights within a call's 64 MiB (servelab.studies.common.carry counts it). opentelemetry-api stays:
# fastapi 0.165 imports it at start (on 2026-12-04 a server without it did not start on the H200, and a Study 1 run
# measured nothing); only the SDK and exporters, which fastapi's extras alone pull, are taken out.
set -euo pipefail
fetch=../shared/gpu/fetch-wheels.sh
[ -x "$fetch" ] || { echo "gpu_wheels: $fetch not found (the shared GPU notes sit beside the checkout)" >&2; exit 1; }
"$fetch" fastapi uvicorn pydantic gguf accelerate
rm -f .whl/nvidia_*.whl .whl/opentelemetry_sdk*.whl .whl/opentelemetry_exporter*.whl .whl/truststore*.whl .whl/httpcore2*.whl .whl/httpx2*.whl
echo "$(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl: $(ls .whl | sed 's/-[0-9].*//' | tr '\n' ' ')"
# every wheel's own requirements (no extras, on the machine's Python) must be carried or in the image: a missing one
# shows only on the GPU, where a server that cannot import it measures nothing
.venv/bin/python - ../shared/gpu/image-packages.txt .whl/*.whl <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
image = {canon(l.strip()) for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")}
wheels = sys.argv[2:]
have = image | {canon(w.split("/")[-1].split("-")[0]) for w in wheels}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "os_name": "posix", "extra": ""}
missing = set()
for w in wheels:
    z = zipfile.ZipFile(w)
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:"):
            r = Requirement(line.split(":", 1)[1].strip())
            if (r.marker is None or r.marker.evaluate(env)) and canon(r.name) not in have:
                missing.add(f"{r.name} (for {w.split('/')[-1].split('-')[0]})")
if missing:
    sys.exit("gpu_wheels: neither carried nor in the image: " + ", ".join(sorted(missing)))
print("gpu_wheels: every carried wheel's requirements are carried or in the image")
PY
