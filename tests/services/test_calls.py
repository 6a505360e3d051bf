"""What a call is before the router takes it (services/calls.py): the source a request's ids
decide, the ids' checks, a raced client id, and the one conversion of an answer to what
``ctx.tools`` resolves to."""

from __future__ import annotations

import pytest

from toolkiln.domain.errors import Conflict, InvalidRequest
from toolkiln.domain.results import error, refused
from toolkiln.services.calls import Answer, CallContext, check_ids, raced_call_id


def test_a_call_naming_an_agent_is_a_models_any_other_the_apis() -> None:
    assert CallContext.of("c1").source == "api"
    named = CallContext.of("c1", "agent-1", "conv", "user")
    assert (named.source, named.agent_id, named.conversation_id) == ("llm", "agent-1", "conv")
    dispatched = CallContext.of("c1").for_agent("agent-2")
    assert (dispatched.source, dispatched.agent_id, dispatched.tool_call_id) == (
        "llm",
        "agent-2",
        "c1",
    )
    assert CallContext.of("given").call_id() == "given"
    assert CallContext.of().call_id() != CallContext.of().call_id()  # new ones


def test_an_id_that_is_not_printable_text_is_refused_naming_its_field() -> None:
    check_ids(CallContext.of("x" * 128, "agent"))
    with pytest.raises(InvalidRequest) as raised:
        check_ids(CallContext.of("ok", conversation_id="a\nb", power_user_id="y" * 129))
    assert [p["field"] for p in raised.value.details] == ["conversation_id", "power_user_id"]


def test_a_conflict_under_a_client_call_id_is_a_duplicate_call_id() -> None:
    with pytest.raises(Conflict) as raised, raced_call_id(CallContext.of("mine")):
        raise Conflict("unique key")
    assert raised.value.code == "duplicate_tool_call_id"
    with pytest.raises(Conflict) as plain, raced_call_id(CallContext.of()):
        raise Conflict("unique key")
    assert plain.value.code == "conflict"  # no client id: no duplicate of one


def test_an_answer_resolves_for_ctx_by_its_kind() -> None:
    err = error("tool_disabled", "The tool is disabled.", {"reason": "manual"})
    failed = refused("call-1", "tool-1", 3, err)
    custom = Answer("custom", failed).value()
    assert custom["error"] == "tool_disabled"
    assert custom["details"]["tool_call_id"] == "call-1"  # the nested call's whole error
    assert custom["details"]["details"] == {"reason": "manual"}
    builtin = Answer("builtin", refused("call-2", None, None, error("not_allowed", "No.")))
    assert builtin.value() == {"error": "not_allowed", "details": {"message": "No."}}
    assert Answer("run_code", failed).value() == failed.as_dict()
