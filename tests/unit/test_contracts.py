"""Tool contract validation and argument schemas (domain/contracts.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from effect_ledger.domain.contracts import (
    LEASE_SECONDS_LIMIT,
    MAX_ATTEMPTS_LIMIT,
    TARGET_LENGTH_MAX,
    argument_violations,
    check_identifier,
    check_target,
    check_text,
    check_tool_name,
    validate_new_contract,
)
from effect_ledger.domain.model import EffectClass, Recovery, ToolContract
from effect_ledger.errors import FieldViolation, InvalidArgument

VALID = ToolContract(
    tool="email.send",
    revision=1,
    effect_class=EffectClass.RETRYABLE_WITH_KEY,
    provider_idempotency=True,
    queryable=True,
    allowed_recovery=(Recovery.RETRY_SAME_KEY, Recovery.QUERY_THEN_RETRY),
    arguments_schema={
        "type": "object",
        "required": ["to"],
        "properties": {"to": {"type": "string"}},
    },
    max_attempts=3,
    lease_seconds=60,
)


def violations_of(contract: ToolContract) -> list[FieldViolation]:
    with pytest.raises(InvalidArgument) as caught:
        validate_new_contract(contract)
    assert caught.value.reason == "INVALID_TOOL_CONTRACT"
    for violation in caught.value.violations:
        assert f"{violation.field}: {violation.description}" in caught.value.message
    return caught.value.violations


@pytest.mark.parametrize(
    "contract",
    [
        VALID,
        replace(VALID, max_attempts=1, lease_seconds=1),
        replace(VALID, max_attempts=MAX_ATTEMPTS_LIMIT, lease_seconds=LEASE_SECONDS_LIMIT),
        replace(VALID, tool="a" * 128),
        replace(VALID, tool="ns:github/issues.create-comment_v2"),
        replace(VALID, arguments_schema=None, allowed_recovery=()),
        replace(
            VALID,
            effect_class=EffectClass.IRREVERSIBLE,
            provider_idempotency=False,
            queryable=False,
            allowed_recovery=(Recovery.MANUAL_ONLY, Recovery.COMPENSATE),
        ),
    ],
    ids=[
        "valid",
        "lower-bounds",
        "upper-bounds",
        "128-char-tool",
        "tool-punctuation",
        "no-schema",
        "irreversible",
    ],
)
def test_valid_contracts_pass(contract):
    validate_new_contract(contract)


VIOLATIONS = [
    ("tool empty", replace(VALID, tool=""), "contract.tool", "must match"),
    ("tool starts with punctuation", replace(VALID, tool=".send"), "contract.tool", "must match"),
    ("tool too long", replace(VALID, tool="a" * 129), "contract.tool", "must match"),
    ("tool with space", replace(VALID, tool="email send"), "contract.tool", "must match"),
    (
        "max_attempts 0",
        replace(VALID, max_attempts=0),
        "contract.max_attempts",
        "between 1 and 100",
    ),
    (
        "max_attempts 101",
        replace(VALID, max_attempts=MAX_ATTEMPTS_LIMIT + 1),
        "contract.max_attempts",
        "between",
    ),
    ("max_attempts negative", replace(VALID, max_attempts=-1), "contract.max_attempts", "between"),
    ("lease 0", replace(VALID, lease_seconds=0), "contract.lease_seconds", "between 1 and 86400"),
    (
        "lease too long",
        replace(VALID, lease_seconds=LEASE_SECONDS_LIMIT + 1),
        "contract.lease_seconds",
        "between",
    ),
    (
        "duplicate recovery",
        replace(VALID, allowed_recovery=(Recovery.COMPENSATE, Recovery.COMPENSATE)),
        "contract.allowed_recovery",
        "has duplicates",
    ),
    (
        "retry same key without provider idempotency",
        replace(
            VALID,
            effect_class=EffectClass.IDEMPOTENT,
            provider_idempotency=False,
            allowed_recovery=(Recovery.RETRY_SAME_KEY,),
        ),
        "contract.allowed_recovery",
        "RETRY_SAME_KEY needs provider_idempotency",
    ),
    (
        "query then retry without queryable",
        replace(VALID, queryable=False, allowed_recovery=(Recovery.QUERY_THEN_RETRY,)),
        "contract.allowed_recovery",
        "QUERY_THEN_RETRY needs queryable",
    ),
    (
        "retryable with key without provider idempotency",
        replace(VALID, provider_idempotency=False, allowed_recovery=()),
        "contract.provider_idempotency",
        "RETRYABLE_WITH_KEY needs provider_idempotency",
    ),
    (
        "schema with a wrong type",
        replace(VALID, arguments_schema={"type": "nonsense"}),
        "contract.arguments_schema_json",
        "is not a JSON Schema",
    ),
    (
        "schema with a non-list required",
        replace(VALID, arguments_schema={"type": "object", "required": "to"}),
        "contract.arguments_schema_json",
        "is not a JSON Schema",
    ),
]


@pytest.mark.parametrize(
    ("contract", "field", "description"),
    [v[1:] for v in VIOLATIONS],
    ids=[v[0] for v in VIOLATIONS],
)
def test_each_violation_is_reported_alone(contract, field, description):
    violations = violations_of(contract)
    assert len(violations) == 1, violations
    assert violations[0].field == field
    assert description in violations[0].description


def test_every_violation_is_reported_at_once():
    contract = replace(
        VALID,
        tool="",
        max_attempts=0,
        lease_seconds=0,
        provider_idempotency=False,
        queryable=False,
        allowed_recovery=(
            Recovery.RETRY_SAME_KEY,
            Recovery.RETRY_SAME_KEY,
            Recovery.QUERY_THEN_RETRY,
        ),
        arguments_schema={"type": 5},
    )
    fields = [v.field for v in violations_of(contract)]
    assert fields == [
        "contract.tool",
        "contract.max_attempts",
        "contract.lease_seconds",
        "contract.allowed_recovery",  # duplicates
        "contract.allowed_recovery",  # RETRY_SAME_KEY without provider_idempotency
        "contract.allowed_recovery",  # QUERY_THEN_RETRY without queryable
        "contract.provider_idempotency",
        "contract.arguments_schema_json",
    ]


# --- arguments against the contract's schema ------------------------------------------------------

SCHEMA = {
    "type": "object",
    "required": ["to", "subject"],
    "additionalProperties": False,
    "properties": {
        "to": {"type": "string", "format": "email"},
        "subject": {"type": "string", "maxLength": 10},
        "cc": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object", "properties": {"priority": {"enum": ["low", "high"]}}},
    },
}


def test_valid_arguments_have_no_violations():
    assert argument_violations(SCHEMA, {"to": "bob@example.com", "subject": "hi", "cc": ["a"]}) == []


def test_violations_name_the_path_inside_the_arguments():
    found = argument_violations(SCHEMA, {"to": 5, "subject": "x" * 11, "cc": ["a", 7], "meta": {"priority": "urgent"}})
    by_field = {v.field: v.description for v in found}
    # Sorted by path: ["cc", "1"] < ["meta", "priority"] < ["subject"] < ["to"].
    assert [v.field for v in found] == [
        "arguments_json['cc'][1]",
        "arguments_json['meta']['priority']",
        "arguments_json['subject']",
        "arguments_json['to']",
    ]
    assert "is not of type 'string'" in by_field["arguments_json['to']"]
    assert "is too long" in by_field["arguments_json['subject']"]
    assert "is not one of" in by_field["arguments_json['meta']['priority']"]


def test_top_level_violations_name_the_whole_arguments():
    found = argument_violations(SCHEMA, {"to": "bob@example.com", "extra": 1})
    assert [v.field for v in found] == ["arguments_json", "arguments_json"]
    descriptions = " ".join(v.description for v in found)
    assert "'subject' is a required property" in descriptions
    assert "Additional properties are not allowed" in descriptions


def test_at_most_twenty_violations_are_reported():
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    found = argument_violations(schema, {f"k{n:02}": "text" for n in range(30)})
    assert len(found) == 20
    assert [v.field for v in found] == [f"arguments_json['k{n:02}']" for n in range(20)]


def test_a_long_error_message_is_cut_at_500_characters():
    schema = {"type": "object", "properties": {"a": {"enum": ["x" * 800]}}}
    (violation,) = argument_violations(schema, {"a": "y"})
    assert len(violation.description) == 500


# --- names, identifiers and text fields ---------------------------------------------------------


def test_check_tool_name():
    assert check_tool_name("email.send") == "email.send"
    with pytest.raises(InvalidArgument) as caught:
        check_tool_name("-bad", field="request.tool")
    assert caught.value.reason == "INVALID_TOOL_NAME"
    assert caught.value.violations[0].field == "request.tool"


@pytest.mark.parametrize("value", ["", "has space", "x" * 257, "caf\u00e9", "tab\t"])
def test_check_identifier_refuses(value):
    with pytest.raises(InvalidArgument) as caught:
        check_identifier(value, "idempotency_key")
    assert caught.value.reason == "INVALID_ID"
    assert caught.value.violations[0].field == "idempotency_key"


def test_check_identifier_accepts_printable_ascii_up_to_256():
    assert check_identifier("k" * 256, "idempotency_key") == "k" * 256
    assert check_identifier("run-1:step/2#a", "idempotency_key") == "run-1:step/2#a"


def test_check_text_and_target():
    assert check_text("", "reason", required=False) == ""
    with pytest.raises(InvalidArgument) as required:
        check_text("   ", "reason", required=True)
    assert required.value.reason == "FIELD_REQUIRED"
    assert check_target("t" * TARGET_LENGTH_MAX) == "t" * TARGET_LENGTH_MAX
    with pytest.raises(InvalidArgument) as long:
        check_target("t" * (TARGET_LENGTH_MAX + 1))
    assert long.value.reason == "TOO_LONG" and long.value.violations[0].field == "target"
