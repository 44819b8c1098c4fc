"""F1.1 and F1.2 are judged per model, then over the models: each model's verdicts across repeats are told, and a
model whose repeats disagree is said to leave the claim's verdict standing or not."""

from servelab.studies.s01_scheduling.verdicts import models_over_repeats, possible_verdicts


def test_a_claim_decided_by_one_model_whatever_the_other_reads():
    # any model at "changes" makes the claim "changes" (combine: one verdict on every model, else changes)
    assert possible_verdicts({"llama": {"changes"}, "qwen": {"holds", "fails"}}) == {"changes"}
    text = models_over_repeats(
        [
            {"llama": "changes", "qwen": "holds"},
            {"llama": "changes", "qwen": "fails"},
            {"llama": "changes", "qwen": "holds"},
        ]
    )
    assert "llama changes in each; qwen holds, fails, holds" in text
    assert "qwen's repeats disagree, so that part is inconclusive; the claim reads changes whichever" in text


def test_a_claim_whose_verdict_turns_on_a_disagreeing_model():
    assert possible_verdicts({"llama": {"holds"}, "qwen": {"holds", "fails"}}) == {"holds", "changes"}
    text = models_over_repeats([{"llama": "holds", "qwen": "holds"}, {"llama": "holds", "qwen": "fails"}])
    assert "the claim could read changes or holds by them" in text


def test_models_that_agree_across_repeats_need_no_caveat_and_one_repeat_says_nothing():
    text = models_over_repeats([{"a": "holds", "b": "changes"}] * 3)
    # the models differ from each other (not across repeats): the rule that joins them is told, and nothing more
    assert (
        text == "Per model over the 3 repeats: a holds in each; b changes in each "
        "(where the models differ, the claim reads changes)"
    )
    assert (
        models_over_repeats([{"a": "holds", "b": "holds"}] * 3)
        == "Per model over the 3 repeats: a holds in each; b holds in each"
    )
    assert models_over_repeats([{"a": "holds"}]) == ""
    # a model missing from a repeat is named so, and is not a disagreement
    assert "disagree" not in models_over_repeats([{"a": "holds"}, {"a": "holds", "b": "fails"}])


def test_a_repeats_reason_tells_the_rule_that_joins_models_that_differ():
    from servelab.studies.s01_scheduling.verdicts import _where, combine

    differ = {"llama": "holds", "qwen": "fails"}
    assert combine(differ) == "changes"
    assert _where(differ) == "llama: holds; qwen: fails (where the models differ, the claim reads changes)"
    assert _where({"llama": "holds", "qwen": "holds"}) == "llama: holds; qwen: holds"
