"""Speculative decoding on the engine's model code (Study 3).

- ``paged_lm.py``: one model with its own paged KV cache, multi-token steps as decode rows, rollback;
- ``proposer.py``: the draft proposes γ tokens; ``verifier.py``: the target scores γ + 1 positions in one forward;
- ``acceptance.py``: greedy match and the Leviathan/Chen rejection rule; ``rollback.py``: KV rollback of both;
- ``gamma.py``: fixed and adaptive γ; ``decoder.py``: the loop, and the autoregressive baseline;
- ``leviathan.py``: the analytical model; ``cost_ratio.py``: the cost ratio c in three execution modes;
- ``pair.py``: loading a draft and a target as ``PagedLM``s; ``study.py``, ``params.py``, ``verdicts.py``, ``plots.py``: Study 3.
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
