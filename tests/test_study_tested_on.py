"""A finding's ``tested_on``: the models that ran, random (``config:``) or trained weights, computed from the specs."""

from servelab.studies.common import tested_on as t  # the module: pytest would collect a function named test*


def test_config_specs_are_random_weights_and_checkpoints_trained():
    assert t.weights("config:gpt2") == "random weights" and t.weights("Qwen/Qwen2-0.5B") == "trained weights"
    assert t.model_name("config:gpt2") == "gpt2" and t.model_name("Qwen/Qwen2-0.5B") == "Qwen/Qwen2-0.5B"


def test_tested_on_groups_specs_in_run_order_without_duplicates():
    got = t.tested_on(["config:b", "config:a", "config:b", "Org/m"], dtype="float16", setting="batch 1")
    assert got == "b, a (architecture-exact, random weights; float16); Org/m (trained weights; float16); batch 1"
    assert t.tested_on(["config:a"]) == "a (architecture-exact, random weights)"
    assert t.tested_on([]) == "" and t.tested_on([float("nan")], setting="x") == ""
