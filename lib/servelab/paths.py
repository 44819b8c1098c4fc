"""Where the repository's shipped data lives: model configs under ``data/models``, results under ``data/results``."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"
