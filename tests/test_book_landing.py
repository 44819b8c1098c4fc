"""The landing table's "Why" and "Evidence" cells: the verdict's reason, cut between words, and the models tested.

The third reader audit found the "Why" cut mid-word at 160 characters and, for most claims, quoting the setup or the
rule ahead of any reason; for the inconclusive claims it never said why. The Evidence column named only a weight
kind ("random weights"), never the models. The notes below follow the shapes the studies' reports write
(``servelab.studies.common.repeats.combine_repeats``): a "[from repeat k of n, ...]" label, the prose, and a bracket
with the headline over repeats and the rule.
"""

from types import SimpleNamespace

from servelab_book.findings_table import (
    clip,
    evidence_text,
    headline_reason,
    inconclusive_reason,
    landing_reason,
    one_line,
    split_brackets,
)
from servelab_book.findings_table import tested_models as models_tested  # a test* name: pytest would collect it

LABEL = "[from repeat 2 of 3, the one nearest the median] "


def row(verdict, note, said="holds;holds;holds", h200="1.0"):
    return SimpleNamespace(verdict=verdict, reason=note, repeat_verdicts=said, h200_value=h200)


def test_a_long_text_is_cut_between_words_never_inside_one():
    text = "the cut in the p99 of each request's worst inter-token gap, median over rates: holds for a 20-70% cut"
    cut = clip(text, 60)
    assert cut.endswith("…") and len(cut) <= 60
    assert text.startswith(cut[:-1])
    assert cut[:-1].split()[-1] in text.split() + [w.rstrip(",") for w in text.split()]  # a whole word
    assert clip("short", 60) == "short"
    assert clip("x" * 300, 160) == "x" * 159 + "…"  # one word longer than the limit: cut where it must be
    # the one-line summary the rule-changes page uses is cut the same way
    assert not one_line("a " + "word " * 60)[:-1].endswith(("wor", "wo"))


def test_brackets_are_taken_out_of_the_prose():
    prose, groups = split_brackets(LABEL + "Some prose [with (a [nested] one)] here. More.")
    assert prose == "Some prose here. More."
    assert groups == ["from repeat 2 of 3, the one nearest the median", "with (a [nested] one)"]


def test_a_decided_verdict_gives_its_headline_against_its_rule_not_its_setup():
    note = (
        LABEL + "causal prefill, batch 1, 2,048 tokens, qwen2-1.5b, D=128; SDPA's default ran cudnn; rule: holds "
        "within 2× of the seed [median 7.588 × naive / SDPA default at 2,048 tokens, 6.638–7.894 × over 3 repeats "
        "(min–max: a 75% interval for the median); the rule: holds within 2× of 7.64]"
    )
    assert headline_reason(split_brackets(note)[1]) == (
        "median 7.588 × naive / SDPA default at 2,048 tokens",
        "holds within 2× of 7.64",
    )
    why = landing_reason(row("holds", note))
    assert why == "Median 7.588 × naive / SDPA default at 2,048 tokens; the rule: holds within 2× of 7.64."
    assert "causal prefill" not in why and "over 3 repeats" not in why  # the setup and the interval are elsewhere


def test_a_headline_in_each_repeat_and_a_number_gets_its_separators():
    note = (
        "x [1881 GB/s (the best compaction measured), 1880–1882 GB/s over 3 repeats (min–max); the rule: holds within "
        "9.5–134 GB/s]"
    )
    assert landing_reason(row("changes", note)).startswith("1,881 GB/s (the best compaction measured); the rule:")
    note = "y [508.2 × growth for 32× longer in each of the 3 repeats; the rule: holds within 2× of 25]"
    assert landing_reason(row("changes", note)) == (
        "508.2 × growth for 32× longer in each of the 3 repeats; the rule: holds within 2× of 25."
    )


def test_what_bounds_the_time_follows_the_rule_where_the_note_says():
    note = (
        "hf_eager: 0.8–1.8% of the memory floor; decode here is bound by kernel launches and framework overhead, not "
        "by HBM bandwidth (each step's median over the 3 repeats). More. [median 10.08 % of the memory floor (lowest "
        "in engine mode), 10.07–10.08 % over 3 repeats (min–max); the rule: bandwidth-bound from 20%]"
    )
    assert landing_reason(row("fails", note)) == (
        "Median 10.08 % of the memory floor (lowest in engine mode); the rule: bandwidth-bound from 20%. Decode here "
        "is bound by kernel launches and framework overhead, not by HBM bandwidth."
    )


def test_a_verdict_per_model_gives_each_models_verdict_the_rule_and_each_models_value():
    note = (
        LABEL + "ChunkedPrefill vs EagerContBatch; the cut, median over rates: holds for a 20-70% cut, changes "
        "outside it, fails at <= 5%. Per model: llama-3-8b: changes; qwen2-0.5b: holds (where the models differ, the "
        "claim reads changes). Near a threshold: more [per model: llama-3-8b median 93.97 % cut in the p99 stall "
        "(median over rates), 91.55–95.41 % over 3 repeats (min–max); qwen2-0.5b median 30.78 % cut in the p99 stall "
        "(median over rates), -818 to 44.7 % over 3 repeats (min–max)]"
    )
    assert landing_reason(row("changes", note)) == (
        "Per model: llama-3-8b: changes; qwen2-0.5b: holds (where the models differ, the claim reads changes). The "
        "rule: holds for a 20-70% cut, changes outside it, fails at <= 5%. llama-3-8b median 93.97, qwen2-0.5b median "
        "30.78 % cut in the p99 stall (median over rates)."
    )


def test_no_rule_in_the_note_gives_its_first_sentence():
    note = LABEL + "at long prompts prefill is compute-bound and the H200's matmul rate is far higher. More [6.5]"
    assert landing_reason(row("changes", note)) == (
        "At long prompts prefill is compute-bound and the H200's matmul rate is far higher."
    )


def test_an_inconclusive_claim_says_why():
    # the repeats disagree: the note's sentence on the repeat that stands apart, without its pointers elsewhere
    note = (
        LABEL + "holds if the stall is cut. Per model over the 3 repeats: a holds in each; b holds, fails, holds. b "
        "fails in repeat 2 of 3 (listed under *Steps held up on the host*), where its worst stall, 532.7 ms, is set "
        "by one step held 531 ms on the host [per model: a median 0.93 × x, 0.9–0.94 × over 3 repeats (min–max); the "
        "3 repeats say holds; changes; holds]"
    )
    why = landing_reason(row("inconclusive", note, "holds;changes;holds"))
    assert why == (
        "The repeats disagree (holds, changes, holds): b fails in repeat 2 of 3, where its worst stall, 532.7 ms, is "
        "set by one step held 531 ms on the host."
    )
    assert "holds if" not in why and "listed under" not in why
    # a repeat whose data was too thin, or one not measured
    assert inconclusive_reason("x [repeat 3 of 3: too thin]", "changes;changes;inconclusive") == (
        "Repeat 3 of 3 had too little data for its rule; the other 2 say changes, and a verdict needs 3."
    )
    assert inconclusive_reason("x [rests on 2 repeats; a verdict needs 3]", "holds;changes;missing") == (
        "Repeat 3 of 3 was not measured; the 2 measured disagree (holds, changes), and a verdict needs 3."
    )
    odd = "Repeat 2 of 3's eager ratio, 0.67×, has the target step faster than the draft: that is not plausible."
    assert inconclusive_reason(f"{LABEL}Eager ratio 1.22×. {odd}", "changes;holds;changes") == (
        "The repeats disagree (changes, holds, changes): repeat 2 of 3's eager ratio, 0.67×, has the target step "
        "faster than the draft: that is not plausible."
    )
    # a note that says itself why it is inconclusive
    own = "The error is 19.7–34.8 % over 2 repeats (goal ≤ 10 %), inconclusive as repeat 3 of 3 lacks 2 of its parts."
    assert inconclusive_reason(own + " More.", "fails;fails") == own
    # a claim with no data keeps its sentence
    assert landing_reason(row("inconclusive", "Not measured: no verdict.", "", "not measured")) == (
        "Not measured: no verdict."
    )


def test_the_evidence_names_the_models_and_their_kind():
    assert models_tested("llama-3-8b, qwen2-0.5b (architecture-exact, random weights; bfloat16); 5 paired runs") == (
        "llama-3-8b, qwen2-0.5b (random weights)"
    )
    assert models_tested(
        "target SmolLM2-135M-Instruct (135M, trained weights); drafts distilled from it in this run: smollm2-draft-2L "
        "(35M), smollm2-draft-6L (50M); bfloat16 | cost at the seed's shapes: distilgpt2 → gpt2-medium, gpt2 → "
        "gpt2-medium, qwen2-0.5b → qwen2-1.5b (architecture-exact, random weights)"
    ) == (
        "SmolLM2-135M-Instruct (trained weights) + smollm2-draft-2L, smollm2-draft-6L (distilled drafts) + "
        "distilgpt2, gpt2-medium, gpt2, qwen2-0.5b, qwen2-1.5b (random weights)"
    )
    # a longer name is not read as a shorter one inside it
    assert models_tested("qwen2-0.5b-vocab128k, llama-3-8b (random weights)") == (
        "qwen2-0.5b-vocab128k, llama-3-8b (random weights)"
    )
    assert models_tested("attention alone at qwen2-1.5b heads (12q/2kv, D=128); random N(0, 1) inputs, bfloat16") == (
        "qwen2-1.5b (attention alone, random inputs)"
    )
    assert models_tested("the policy simulator (no model, no GPU): 10,000 requests") == "policy simulator"
    cell = SimpleNamespace(
        h200_value="2.03×", freshness="fresh", repeats=3, repeat_verdicts="holds;holds;holds", spread="2.018–2.09",
        headline_unit="× TTFT speedup at turn 10", tested_on="qwen2-0.5b (architecture-exact, random weights)",
    )  # fmt: skip
    assert (
        evidence_text(cell)
        == "3 repeats; interval 2.018–2.09 × TTFT speedup at turn 10; qwen2-0.5b (random weights); fresh"
    )
    assert "qwen2-0.5b" not in evidence_text(cell, models=False)  # the findings page gives tested_on whole
