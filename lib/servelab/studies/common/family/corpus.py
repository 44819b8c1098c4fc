"""A training corpus that exists offline on every machine: the Python source already on disk.

The standard library and the installed packages' ``.py`` files are read in a deterministic order (by a
hash of each file's package-relative path, which interleaves packages instead of taking them
alphabetically), up to a byte cap. Whole files are held out for evaluation, chosen by the same hash, so
a file is held out on every machine that has it and evaluation prompts never come from text a model
was trained on.

The manifest records the roots, packages, file counts, bytes and one sha256 over every selected file's
path and content: two corpora with the same manifest hash are the same bytes, whatever the directory
they were read from.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from servelab.errors import ParameterError

# Generated tables (unicode data, big lookup tables) and vendored bundles are not the code a model should
# learn from, and one of them could fill a small corpus alone.
DEFAULT_MAX_FILE_BYTES = 256 * 1024
# Directories inside the stdlib root that hold installed packages, not the stdlib itself.
NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class SourceFile:
    """One ``.py`` file: ``package`` is ``stdlib`` or the top-level name under site-packages."""

    root: str  # name of the root it was found under ("stdlib", "site-packages")
    package: str
    relpath: str  # posix path relative to the root
    path: Path
    size: int  # bytes on disk

    @property
    def key(self) -> str:
        return f"{self.root}/{self.relpath}"

    @property
    def order(self) -> int:
        """Position in the deterministic order: the first 8 bytes of sha256 of the key."""
        return int.from_bytes(hashlib.sha256(self.key.encode()).digest()[:8], "big")


@dataclass
class Corpus:
    """Selected source files with their text, split by whole files into train and held-out."""

    train: list[SourceFile]
    heldout: list[SourceFile]
    text: dict[str, str] = field(repr=False)  # key -> file text
    manifest: dict

    def texts(self, split: str = "train") -> list[str]:
        if split not in ("train", "heldout"):
            raise ParameterError(f"split must be 'train' or 'heldout', got {split!r}")
        return [self.text[f.key] for f in (self.train if split == "train" else self.heldout)]

    def packages(self) -> pd.DataFrame:
        """Per package: files and bytes in the train and held-out splits."""
        return pd.DataFrame(self.manifest["packages"])


def default_roots() -> dict[str, Path]:
    """The standard library and the running interpreter's package directories (``purelib``, ``platlib`` and
    ``site.getsitepackages()``: on Debian-style Pythons the packages of the image may sit in another one than
    ``purelib``), the first named ``site-packages``, further ones ``site-packages-2``, … in sorted order."""
    import site

    paths = sysconfig.get_paths()
    stdlib = Path(paths["stdlib"]).resolve()
    candidates = [paths["purelib"], paths["platlib"]]
    with contextlib.suppress(AttributeError):  # old virtualenvs' site.py lacks it
        candidates += site.getsitepackages()
    found = []
    for c in candidates:
        p = Path(c).resolve()
        if p.is_dir() and p not in found and p != stdlib:
            found.append(p)
    roots = {"stdlib": stdlib}
    primary = Path(paths["purelib"]).resolve()
    ordered = ([primary] if primary in found else []) + sorted(p for p in found if p != primary)
    for i, p in enumerate(ordered):
        roots["site-packages" if i == 0 else f"site-packages-{i + 1}"] = p
    return roots


def discover(roots: dict[str, Path], max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> list[SourceFile]:
    """Every non-empty ``.py`` file of at most ``max_file_bytes`` under the roots, in deterministic order."""
    found: dict[str, SourceFile] = {}
    for name, root in roots.items():
        root = Path(root)
        if not root.is_dir():
            raise ParameterError(f"corpus root {name!r} is not a directory: {root}")
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            # skip caches everywhere, and other roots nested inside this one (site-packages in stdlib)
            dirnames[:] = sorted(
                d for d in dirnames if d != "__pycache__" and not (name == "stdlib" and d in NOT_STDLIB)
            )
            for fn in filenames:
                if not fn.endswith(".py"):
                    continue
                p = Path(dirpath) / fn
                try:
                    size = p.stat().st_size
                except OSError:
                    continue
                if size == 0 or size > max_file_bytes:
                    continue
                rel = (rel_dir / fn).as_posix()
                package = "stdlib" if name == "stdlib" else rel.split("/", 1)[0].removesuffix(".py")
                sf = SourceFile(name, package, rel, p, size)
                found.setdefault(sf.key, sf)
    return sorted(found.values(), key=lambda f: (f.order, f.key))


def is_heldout(f: SourceFile, fraction: float) -> bool:
    """Held out by a second hash of the key, independent of the order hash and of the byte cap."""
    h = int.from_bytes(hashlib.sha256(("heldout:" + f.key).encode()).digest()[:8], "big")
    return h < fraction * 2**64


def build_corpus(
    max_bytes: int = 64 * 2**20,
    heldout_fraction: float = 0.02,
    *,
    roots: dict[str, Path] | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    min_heldout_files: int = 2,
) -> Corpus:
    """Read source files in deterministic order until ``max_bytes`` (bytes of text) are selected.

    Files that are not UTF-8 are skipped (the stdlib's tests ship a few on purpose), and so are exact
    copies of a file already selected (vendored modules), so that no held-out text is also trained on. At least
    ``min_heldout_files`` files are held out even when the hash picks fewer (small smoke corpora).
    """
    if not isinstance(max_bytes, int) or max_bytes < 1024:
        raise ParameterError(f"max_bytes must be an int of at least 1024, got {max_bytes!r}")
    if not 0.0 < heldout_fraction < 0.5:
        raise ParameterError(f"heldout_fraction must be in (0, 0.5), got {heldout_fraction!r}")
    roots = {k: Path(v) for k, v in (roots or default_roots()).items()}
    selected: list[SourceFile] = []
    text: dict[str, str] = {}
    digest = hashlib.sha256()
    seen: set[bytes] = set()
    total = 0
    for f in discover(roots, max_file_bytes):
        if total >= max_bytes:
            break
        try:
            raw = f.path.read_bytes()
            s = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        content = hashlib.sha256(raw).digest()
        if not s.strip() or content in seen:  # vendored copies: a held-out file must not also be trained on
            continue
        seen.add(content)
        selected.append(f)
        text[f.key] = s
        digest.update(f.key.encode() + b"\0" + content)
        total += len(raw)
    if len(selected) < 2 * min_heldout_files:
        raise ParameterError(
            f"only {len(selected)} source files found under {roots}; need at least {2 * min_heldout_files}"
        )
    held = [f for f in selected if is_heldout(f, heldout_fraction)]
    if len(held) < min_heldout_files:  # tiny corpora: hold out the last files in the order
        held = held + [f for f in reversed(selected) if f not in held][: min_heldout_files - len(held)]
    held_keys = {f.key for f in held}
    train = [f for f in selected if f.key not in held_keys]
    held = [f for f in selected if f.key in held_keys]
    return Corpus(
        train,
        held,
        text,
        _manifest(roots, train, held, digest.hexdigest(), max_bytes, heldout_fraction, max_file_bytes),
    )


def _manifest(roots, train, held, sha, max_bytes, heldout_fraction, max_file_bytes) -> dict:
    rows = {}
    for split, files in (("train", train), ("heldout", held)):
        for f in files:
            r = rows.setdefault(
                f.package,
                {"package": f.package, "train_files": 0, "train_bytes": 0, "heldout_files": 0, "heldout_bytes": 0},
            )
            r[f"{split}_files"] += 1
            r[f"{split}_bytes"] += f.size
    packages = sorted(rows.values(), key=lambda r: (-(r["train_bytes"] + r["heldout_bytes"]), r["package"]))
    return {
        "sha256": sha,
        "python": sys.version.split()[0],
        "roots": {k: str(v) for k, v in roots.items()},
        "max_bytes": max_bytes,
        "max_file_bytes": max_file_bytes,
        "heldout_fraction": heldout_fraction,
        "files": len(train) + len(held),
        "bytes": sum(f.size for f in train + held),
        "train_files": len(train),
        "train_bytes": sum(f.size for f in train),
        "heldout_files": len(held),
        "heldout_bytes": sum(f.size for f in held),
        "packages": packages,
    }


def heldout_prompts(token_files: list[list[int]], n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens, each from a different held-out file where possible.

    ``token_files`` holds each held-out file's token ids (any tokenizer: the family's, or a hub model's).
    Files shorter than ``length`` are skipped; the offset inside a file is drawn with ``seed``.
    """
    if not isinstance(n, int) or n < 1 or not isinstance(length, int) or length < 1:
        raise ParameterError(f"need n >= 1 and length >= 1 tokens, got n={n!r}, length={length!r}")
    long_enough = [t for t in token_files if len(t) >= length]
    if not long_enough:
        raise ParameterError(
            f"no held-out file has {length} tokens; the longest has {max((len(t) for t in token_files), default=0)}"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(long_enough))
    prompts = []
    for i in range(n):
        toks = long_enough[order[i % len(order)]]
        start = int(rng.integers(0, len(toks) - length + 1))
        prompts.append([int(t) for t in toks[start : start + length]])
    return prompts
