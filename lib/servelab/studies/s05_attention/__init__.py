"""Study 5: attention kernels — every variant behind one call signature, checked against a float64
reference, swept over prefill and decode shapes, and judged against the measured ceilings.

``shapes``/``masks``/``variants``/``backends``/``reference``: what is computed and by whom; ``point``/``sweep``/
``memory``: measuring it; ``recommend``/``report``/``page``: the page's tables and sections; ``verdicts`` (F5.1–F5.3),
``plots``, ``params``.

    attn = VARIANTS["sdpa_flash"].build(AttentionShape.prefill(arch, 4096), "cuda")
    out = attn(q, k, v)
"""

from servelab.studies.s05_attention.masks import Mask, ragged_documents
from servelab.studies.s05_attention.params import study_params
from servelab.studies.s05_attention.point import TimingPolicy, measure_point
from servelab.studies.s05_attention.reference import reference_attention, relative_error, tolerance
from servelab.studies.s05_attention.shapes import Architecture, AttentionShape
from servelab.studies.s05_attention.sweep import add_roofline, decode_sweep, mask_factories, mask_sweep, prefill_sweep
from servelab.studies.s05_attention.variants import VARIANTS, Unavailable, Variant, get_variant

__all__ = [
    "Mask",
    "ragged_documents",
    "Architecture",
    "AttentionShape",
    "VARIANTS",
    "Unavailable",
    "Variant",
    "get_variant",
    "reference_attention",
    "relative_error",
    "tolerance",
    "TimingPolicy",
    "measure_point",
    "add_roofline",
    "decode_sweep",
    "mask_factories",
    "mask_sweep",
    "prefill_sweep",
    "study_params",
]
