"""Drafts for a real target, distilled from its own generations (as EAGLE and Medusa drafts are trained).

- ``prompts.py``: the chat prompts, written here: training topics and held-out topics never trained on;
- ``generate.py``: batched greedy (or sampled) continuations of a target, the distillation data;
- ``distill.py``: drafts of a few layers initialised from the target's first layers and trained on its generations,
  each in a wall-time budget of its own, cached on disk (``$SERVELAB_TRAINED``).
"""
