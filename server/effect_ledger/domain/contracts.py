"""Validation of tool contracts, tool names and intent fields (limits on everything)."""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from effect_ledger.domain.budgets import DIMENSION, ESTIMATE_DIMENSIONS_MAX, INT64_MAX
from effect_ledger.domain.model import EffectClass, Recovery, ToolContract
from effect_ledger.errors import FieldViolation, InvalidArgument

TOOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")
IDENTIFIER = re.compile(r"^[\x21-\x7e]{1,256}$")  # printable ASCII, no spaces
MAX_ATTEMPTS_LIMIT = 100
LEASE_SECONDS_LIMIT = 86_400
TARGET_LENGTH_MAX = 1024
REASON_LENGTH_MAX = 2048
SCHEMA_SIZE_MAX_BYTES = 64 * 1024


def check_tool_name(value: str, field: str = "tool") -> str:
    if not TOOL_NAME.match(value):
        raise InvalidArgument.field(
            field, "must match [A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}", reason="INVALID_TOOL_NAME"
        )
    return value


def check_identifier(value: str, field: str) -> str:
    if not IDENTIFIER.match(value):
        raise InvalidArgument.field(
            field, "must be 1 to 256 printable ASCII characters without spaces", reason="INVALID_ID"
        )
    return value


def check_text(value: str, field: str, *, required: bool, length_max: int = REASON_LENGTH_MAX) -> str:
    if required and not value.strip():
        raise InvalidArgument.field(field, "is required", reason="FIELD_REQUIRED")
    if len(value) > length_max:
        raise InvalidArgument.field(field, f"is longer than {length_max} characters", reason="TOO_LONG")
    return value


def check_target(value: str) -> str:
    return check_text(value, "target", required=True, length_max=TARGET_LENGTH_MAX)


def validate_new_contract(contract: ToolContract) -> None:
    """Refuse a contract whose terms are incomplete or contradict each other."""
    violations: list[FieldViolation] = []
    if not TOOL_NAME.match(contract.tool):
        violations.append(FieldViolation("contract.tool", "must match [A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}"))
    if not 1 <= contract.max_attempts <= MAX_ATTEMPTS_LIMIT:
        violations.append(
            FieldViolation("contract.max_attempts", f"must be between 1 and {MAX_ATTEMPTS_LIMIT}")
        )
    if not 1 <= contract.lease_seconds <= LEASE_SECONDS_LIMIT:
        violations.append(
            FieldViolation("contract.lease_seconds", f"must be between 1 and {LEASE_SECONDS_LIMIT}")
        )
    if len(set(contract.allowed_recovery)) != len(contract.allowed_recovery):
        violations.append(FieldViolation("contract.allowed_recovery", "has duplicates"))
    if Recovery.RETRY_SAME_KEY in contract.allowed_recovery and not contract.provider_idempotency:
        violations.append(
            FieldViolation(
                "contract.allowed_recovery",
                "RETRY_SAME_KEY needs provider_idempotency: without it a retry may apply twice",
            )
        )
    if Recovery.QUERY_THEN_RETRY in contract.allowed_recovery and not contract.queryable:
        violations.append(
            FieldViolation("contract.allowed_recovery", "QUERY_THEN_RETRY needs queryable")
        )
    if contract.effect_class == EffectClass.RETRYABLE_WITH_KEY and not contract.provider_idempotency:
        violations.append(
            FieldViolation("contract.provider_idempotency", "RETRYABLE_WITH_KEY needs provider_idempotency")
        )
    if len(contract.default_estimate) > ESTIMATE_DIMENSIONS_MAX:
        violations.append(
            FieldViolation("contract.default_estimate", f"at most {ESTIMATE_DIMENSIONS_MAX} dimensions")
        )
    for dimension, amount in sorted(contract.default_estimate.items()):
        if not DIMENSION.match(dimension):
            violations.append(FieldViolation(f"contract.default_estimate[{dimension[:70]!r}]", "not a valid dimension name"))
        elif not 0 <= amount <= INT64_MAX:
            violations.append(
                FieldViolation(f"contract.default_estimate[{dimension!r}]", "must be between 0 and 2^63-1")
            )
    if contract.arguments_schema is not None:
        try:
            jsonschema.Draft202012Validator.check_schema(contract.arguments_schema)
        except jsonschema.SchemaError as error:
            violations.append(
                FieldViolation("contract.arguments_schema_json", f"is not a JSON Schema: {error.message}")
            )
    if violations:
        raise InvalidArgument(
            "; ".join(f"{v.field}: {v.description}" for v in violations),
            reason="INVALID_TOOL_CONTRACT",
            violations=violations,
        )


def argument_violations(schema: dict[str, Any], arguments: dict[str, Any]) -> list[FieldViolation]:
    """The arguments' violations of the contract's schema (at most 20), sorted by path."""
    validator = jsonschema.Draft202012Validator(schema)
    found = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.path))):
        path = "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in error.path)
        found.append(FieldViolation(f"arguments_json{path}", error.message[:500]))
        if len(found) == 20:
            break
    return found
