"""The proposal reader takes whatever a model sends without raising: every shape of
arguments becomes a proposal or a list of problems naming fields."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from toolkiln.domain.analysis import Analysis
from toolkiln.domain.generation import as_expect, parse_proposal
from toolkiln.domain.tools import validate_draft

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
keys = st.sampled_from(
    [
        "name",
        "description",
        "language",
        "parameters",
        "code",
        "examples",
        "execution_message_description",
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(keys, json_values) | json_values)
def test_any_json_arguments_give_a_proposal_or_problems(raw: object) -> None:
    proposal, problems = parse_proposal(json.dumps(raw), "python", None)
    assert (proposal is None) == bool(problems)
    assert all(isinstance(p["field"], str) and isinstance(p["message"], str) for p in problems)
    if proposal is not None:
        validate_draft(proposal.draft, 30000, Analysis(), None)  # never raises either
        for example in proposal.examples:
            assert isinstance(example["input"], dict)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_any_text_as_arguments_is_read_or_refused(text: str) -> None:
    proposal, problems = parse_proposal(text, "javascript", "fixed-name")
    assert proposal is not None or problems


@given(json_values)
def test_any_expected_reads_as_a_partial_result(expected: object) -> None:
    expect = as_expect(expected)
    assert set(expect) <= {"status", "message", "raw_data", "error_code"} and expect
