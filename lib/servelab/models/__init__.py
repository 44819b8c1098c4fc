"""Model loading (hub id, local directory, or ``config:<name>``) and model shapes (FLOPs, bytes)."""

from servelab.models.loader import LoadedModel, ModelLoadError, load_model, shipped_configs
from servelab.models.shape import ModelShape

__all__ = ["LoadedModel", "ModelLoadError", "load_model", "shipped_configs", "ModelShape"]
