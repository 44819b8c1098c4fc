"""ChunkedPrefill: continuous batching under a per-step token budget (Sarathi-Serve, vLLM V1).

Each step holds at most ``max_num_batched_tokens`` tokens (the budget). Running decodes go first, one
token each; prefill chunks fill the rest of the budget: the rest of a prompt already being prefilled, then
newcomers in arrival order, the last one cut to what is left. A long prompt therefore spreads over several
steps while decodes keep going (the bounded decode stall of claim F1.1). When blocks run out, the newest
running sequence is preempted by recompute; no one is admitted in that step.

This is the engine's default scheduler, ``TokenBudgetScheduler``, under its Study 1 name. Its loop serves
running sequences oldest first, which puts every decode before any chunk: a sequence whose prompt is cut
by the budget takes all that is left, so no one is admitted behind it until its prompt is done: at most one
sequence is mid-prompt at a time, and it is the newest running one. Since the budget is at least
``max_num_seqs``, every running decode fits.
"""

from __future__ import annotations

from servelab.engine.scheduler import TokenBudgetScheduler


class ChunkedPrefill(TokenBudgetScheduler):
    pass
