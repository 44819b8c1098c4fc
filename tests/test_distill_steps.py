"""A distillation recipe with a step count trains exactly that many steps, so the parts of one repeat that train the
same recipe on different machines train the same draft (up to the device's non-determinism)."""

import pytest
import torch

from servelab.models import load_model
from servelab.studies.common.drafts import distill

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread


def _data(target):
    g = torch.Generator().manual_seed(8)
    return [dict(prompt=torch.randint(3, 512, (n,), generator=g).tolist(), answer=[5, 6, 7, 8]) for n in (5, 6, 7)]


def test_a_step_count_fixes_the_draft():
    target = load_model("config:tiny-llama", dtype="float32", device="cpu", seed=0).model
    recipe = distill.DistillRecipe("test", (1,), 3, 4, 0, 0.8, 3, 60.0, 2, 3e-3, 2, train_steps=4)
    a, curve, _ = distill.train_draft(target, 1, _data(target), recipe)
    b, _, _ = distill.train_draft(target, 1, _data(target), recipe)
    assert len(curve) == 4
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)


def test_the_learning_rate_decays_over_the_steps_when_given():
    assert distill.lr_at(0.0, 100.0, 10, 1.0, 2, steps=10) == pytest.approx(0.1)
    assert distill.lr_at(100.0, 100.0, 5, 1.0, 2) == pytest.approx(0.1)  # without steps: over the time budget
