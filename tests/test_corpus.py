"""The source corpus: deterministic selection, whole-file hold-out, manifest hash, prompts from held-out files."""

from pathlib import Path

import pytest

from servelab.errors import ParameterError
from servelab.studies.common.family.corpus import build_corpus, default_roots, discover, heldout_prompts, is_heldout


def _write_tree(root: Path, n: int = 40) -> None:
    """A fake site-packages: packages with modules of varied size, plus files the corpus must skip."""
    for i in range(n):
        pkg = root / f"pkg{i % 4}"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / f"mod{i}.py").write_text(
            "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(10 + i))
        )
    (root / "pkg0" / "empty.py").write_text("")
    (root / "pkg0" / "latin1.py").write_bytes(b"s = '\xe9\xe8'\n" * 20)  # not UTF-8
    (root / "pkg1" / "huge.py").write_text("x = 1\n" * 20000)  # over max_file_bytes below
    (root / "pkg1" / "__pycache__").mkdir()
    (root / "pkg1" / "__pycache__" / "cached.py").write_text("y = 2\n")
    (root / "pkg2" / "notes.txt").write_text("not python\n")


@pytest.fixture
def tree(tmp_path):
    _write_tree(tmp_path / "site")
    return {"site-packages": tmp_path / "site"}


def test_discover_skips_empty_oversized_cache_and_other_files(tree):
    files = discover(tree, max_file_bytes=64 * 1024)
    names = {f.relpath for f in files}
    assert len(files) == 41  # 40 modules + latin1.py (decoding is build_corpus's job)
    assert "pkg1/huge.py" not in names and "pkg0/empty.py" not in names
    assert not any("__pycache__" in n or n.endswith(".txt") for n in names)
    assert {f.package for f in files} == {"pkg0", "pkg1", "pkg2", "pkg3"}
    assert [f.order for f in files] == sorted(f.order for f in files)  # deterministic hash order


def test_build_is_deterministic_and_the_hash_tracks_content(tree):
    a = build_corpus(1 << 20, 0.1, roots=tree, max_file_bytes=64 * 1024)
    b = build_corpus(1 << 20, 0.1, roots=tree, max_file_bytes=64 * 1024)
    assert a.manifest["sha256"] == b.manifest["sha256"]
    assert [f.key for f in a.train] == [f.key for f in b.train]
    assert all("latin1" not in f.key for f in a.train + a.heldout)  # non-UTF-8 skipped
    (tree["site-packages"] / "pkg3" / "mod3.py").write_text("changed = True\n")
    c = build_corpus(1 << 20, 0.1, roots=tree, max_file_bytes=64 * 1024)
    assert c.manifest["sha256"] != a.manifest["sha256"]


def test_holdout_is_whole_files_disjoint_from_train(tree):
    c = build_corpus(1 << 20, 0.2, roots=tree, max_file_bytes=64 * 1024)
    train, held = {f.key for f in c.train}, {f.key for f in c.heldout}
    assert held and train and not (train & held)
    assert all(is_heldout(f, 0.2) for f in c.heldout)
    m = c.manifest
    assert m["files"] == len(train) + len(held) == 40
    assert m["heldout_files"] == len(held)
    assert sum(p["train_files"] + p["heldout_files"] for p in m["packages"]) == m["files"]
    assert sum(p["train_bytes"] + p["heldout_bytes"] for p in m["packages"]) == m["bytes"]
    assert c.texts("heldout")[0] == c.heldout[0].path.read_text()


def test_exact_copies_are_read_once(tree):
    site = tree["site-packages"]
    (site / "vendor").mkdir()
    (site / "vendor" / "copy_of_mod5.py").write_text((site / "pkg1" / "mod5.py").read_text())
    c = build_corpus(1 << 20, 0.1, roots=tree, max_file_bytes=64 * 1024)
    texts = c.texts("train") + c.texts("heldout")
    assert len(texts) == len(set(texts)) == 40


def test_byte_cap_and_minimum_holdout(tree):
    c = build_corpus(4096, 0.01, roots=tree, max_file_bytes=64 * 1024, min_heldout_files=2)
    sizes = [f.size for f in c.train + c.heldout]
    assert sum(sizes) >= 4096 and sum(sizes) - max(sizes) < 4096  # stops right after crossing the cap
    assert len(c.heldout) >= 2


def test_bad_parameters_are_rejected(tree, tmp_path):
    with pytest.raises(ParameterError, match="max_bytes"):
        build_corpus(10, roots=tree)
    with pytest.raises(ParameterError, match="heldout_fraction"):
        build_corpus(1 << 20, 0.7, roots=tree)
    with pytest.raises(ParameterError, match="not a directory"):
        build_corpus(1 << 20, roots={"x": tmp_path / "missing"})
    with pytest.raises(ParameterError, match="split"):
        build_corpus(1 << 20, roots=tree, max_file_bytes=64 * 1024).texts("test")


def test_heldout_prompts_are_slices_of_one_file():
    files = [list(range(100, 150)), list(range(200, 210)), list(range(300, 380))]
    ps = heldout_prompts(files, 4, 20, seed=1)
    assert len(ps) == 4 and all(len(p) == 20 for p in ps)
    for p in ps:  # contiguous run from a file long enough
        src = next(f for f in files if p[0] in f)
        i = src.index(p[0])
        assert src[i : i + 20] == p and len(src) >= 20
    assert heldout_prompts(files, 4, 20, seed=1) == ps
    with pytest.raises(ParameterError, match="no held-out file"):
        heldout_prompts(files, 1, 500)
    with pytest.raises(ParameterError):
        heldout_prompts(files, 0, 5)


def test_default_roots_find_the_standard_library():
    roots = default_roots()
    assert (roots["stdlib"] / "os.py").exists()
