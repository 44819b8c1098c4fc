"""Speculative decoding on the engine's model code.

- ``paged_lm.py``: one model with its own paged KV cache, multi-token steps as decode rows, rollback;
- ``proposer.py``: the draft proposes γ tokens; ``verifier.py``: the target scores γ + 1 positions in one forward;
- ``acceptance.py``: greedy match and the Leviathan/Chen rejection rule; ``rollback.py``: KV rollback of both;
- ``gamma.py``: fixed and adaptive γ; ``decoder.py``: the loop, and the autoregressive baseline;
- ``batch_lm.py`` and ``batch_decoder.py``: the greedy loop over a batch (ragged acceptance, one readback a round);
- ``batch_lookup.py``: the same loop with prompt lookup proposing on the host (``prompt_lookup.py``), no draft model;
- ``controlled.py``: proposals overridden to a set acceptance α; ``syncs.py``: counting host syncs;
- ``leviathan.py``: the analytical model. (The server speculates through the engine's mode:
  ``engine.speculative_engine``.)

Study 3 (``servelab.studies.s03_speculative``) measures it; nothing here imports a study.
"""

from servelab.spec.acceptance import Acceptance, greedy_accept, probabilities, rejection_accept
from servelab.spec.decoder import Generation, Round, SpeculativeDecoder, autoregressive
from servelab.spec.gamma import AdaptiveGamma, FixedGamma, gamma_policy
from servelab.spec.paged_lm import PagedLM, spec_engine_config

__all__ = [
    "Acceptance",
    "greedy_accept",
    "probabilities",
    "rejection_accept",
    "Generation",
    "Round",
    "SpeculativeDecoder",
    "autoregressive",
    "AdaptiveGamma",
    "FixedGamma",
    "gamma_policy",
    "PagedLM",
    "spec_engine_config",
]
