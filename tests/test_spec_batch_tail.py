"""``scripts/spec_batch_tail.py``: one request runs exactly the steps it needs; a batch of several runs more than its
mean request's (it waits for the slowest); every draft kept (α = 1) gives γ + 1 tokens a step and no tail."""

import importlib.util

from servelab.paths import REPO_ROOT

spec = importlib.util.spec_from_file_location("spec_batch_tail", REPO_ROOT / "scripts" / "spec_batch_tail.py")
tail = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tail)


def test_a_batch_waits_for_its_slowest_request_and_one_request_does_not():
    assert (tail.batch_tail(0.8, 4, 255, 1, trials=20) == 1).all()
    eight = tail.batch_tail(0.8, 4, 255, 8, trials=50)
    assert (eight >= 1).all() and eight.mean() > 1.02


def test_every_draft_kept_gives_gamma_plus_one_tokens_a_step():
    import numpy as np

    rng = np.random.default_rng(0)
    assert tail.steps(rng, 1.0, 4, 255) == 51  # 51 steps of γ + 1 = 5 tokens
    assert (tail.batch_tail(1.0, 4, 255, 8, trials=5) == 1).all()
