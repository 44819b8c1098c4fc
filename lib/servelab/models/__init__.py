"""Model loading (``config:<name>``, a directory, a hub id, or a GGUF such as ``SMOLLM2``) and model shapes
(FLOPs, bytes)."""

from servelab.models.loader import SMOLLM2, LoadedModel, ModelLoadError, load_model, model_directory, shipped_configs
from servelab.models.shape import ModelShape

__all__ = ["SMOLLM2", "LoadedModel", "ModelLoadError", "load_model", "model_directory", "shipped_configs", "ModelShape"]
