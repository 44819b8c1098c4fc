"""The finding on one of a study's claims (studies.common.claim_finding): the claim's words come from the study's
table by id, everything else by name; a claim whose part produced nothing fails with no headline."""

import pytest

from servelab.studies.common.claim_finding import claim_finding, failed_to_run

CLAIMS = {"F9.1": "decode is flat", "F9.2": "prefill is compute-bound"}


def test_the_claim_comes_from_the_table_by_id():
    f = claim_finding(
        CLAIMS, "F9.2", seed_value="30–70", measured_value="41", unit="µs/token", verdict="holds", note="within"
    )
    assert (f.id, f.claim, f.seed_value, f.measured_value, f.verdict) == (
        "F9.2",
        "prefill is compute-bound",
        "30–70",
        "41",
        "holds",
    )


def test_an_unknown_claim_and_a_missing_field_are_refused():
    with pytest.raises(KeyError):
        claim_finding(CLAIMS, "F9.3", seed_value="", measured_value="", unit="", verdict="holds", note="")
    with pytest.raises(TypeError):  # Finding takes named fields and needs every one without a default
        claim_finding(CLAIMS, "F9.1", seed_value="3%", measured_value="2%", unit="%", note="no verdict given")


def test_a_claim_that_ran_nothing_fails_with_no_headline():
    f = failed_to_run(CLAIMS, "F9.1", seed_value="3%", unit="%", note="no decode point ran", tested_on="gpt2")
    assert (f.claim, f.verdict, f.measured_value, f.headline, f.tested_on) == (
        "decode is flat",
        "fails",
        "no data",
        None,
        "gpt2",
    )
    assert failed_to_run(CLAIMS, "F9.1", seed_value="", unit="", note="", measured_value="no point").measured_value == (
        "no point"
    )
