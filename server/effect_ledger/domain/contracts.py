"""Validation of tool contracts, tool names and intent fields (limits on everything).

Identifiers (run, effect, attempt, approval, checkpoint and decision ids, idempotency keys,
request ids, scope ids) are 1 to 256 printable ASCII characters without spaces; tool names
match ``TOOL_NAME``. Both are matched whole (``fullmatch``: a trailing newline is refused too).
Text (targets, labels, provider references, reasons, comments) may be any Unicode text except
``REFUSED_CHARACTERS``: control characters (category Cc: NUL, newlines, ESC and the rest of C0
and C1, DEL), the line and paragraph separators U+2028/U+2029, and the bidi embedding, override
and isolate controls U+202A-U+202E and U+2066-U+2069, which let a string display as something
other than what it holds. Prose written for people (reasons, comments, a fork's difference) may
also hold line feeds and tabs (``lines=True``). ``check_text`` is the one check of text.
"""

from __future__ import annotations

import re

from effect_ledger.domain.budgets import DIMENSION, ESTIMATE_DIMENSIONS_MAX, INT64_MAX
from effect_ledger.domain.model import EffectClass, Recovery, ToolContract

# SCHEMA_SIZE_MAX_BYTES and argument_violations are re-exported: callers reach them here.
from effect_ledger.domain.schemas import (  # noqa: F401
    SCHEMA_SIZE_MAX_BYTES,
    argument_violations,
    schema_violations,
)
from effect_ledger.errors import FieldViolation, InvalidArgument

TOOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")
IDENTIFIER = re.compile(r"[\x21-\x7e]{1,256}")  # printable ASCII, no spaces
REFUSED_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
REFUSED_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
MAX_ATTEMPTS_LIMIT = 100
LEASE_SECONDS_LIMIT = 86_400
TARGET_LENGTH_MAX = 1024
REASON_LENGTH_MAX = 2048


def check_tool_name(value: str, field: str = "tool") -> str:
    if not TOOL_NAME.fullmatch(value):
        raise InvalidArgument.field(field, "must match [A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}", reason="INVALID_TOOL_NAME")
    return value


def is_identifier(value: str) -> bool:
    return IDENTIFIER.fullmatch(value) is not None


def check_identifier(value: str, field: str) -> str:
    if not IDENTIFIER.fullmatch(value):
        raise InvalidArgument.field(
            field, "must be 1 to 256 printable ASCII characters without spaces", reason="INVALID_ID"
        )
    return value


def check_text(
    value: str, field: str, *, required: bool, length_max: int = REASON_LENGTH_MAX, lines: bool = False
) -> str:
    if required and not value.strip():
        raise InvalidArgument.field(field, "is required", reason="FIELD_REQUIRED")
    if len(value) > length_max:
        raise InvalidArgument.field(field, f"is longer than {length_max} characters", reason="TOO_LONG")
    refused = (REFUSED_IN_LINES if lines else REFUSED_CHARACTERS).search(value)
    if refused is not None:
        raise InvalidArgument.field(
            field,
            f"holds the control character U+{ord(refused.group()):04X} at offset {refused.start()}",
            reason="CONTROL_CHARACTER",
        )
    return value


def check_target(value: str) -> str:
    return check_text(value, "target", required=True, length_max=TARGET_LENGTH_MAX)


def validate_new_contract(contract: ToolContract, schema_problems: list[str] | None = None) -> None:
    """Refuse a contract whose terms are incomplete or contradict each other. ``schema_problems``:
    its arguments schema's problems, found already (``schemas.schema_problems``, in a worker
    process); None: found here."""
    violations: list[FieldViolation] = []
    if not TOOL_NAME.fullmatch(contract.tool):
        violations.append(FieldViolation("contract.tool", "must match [A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}"))
    if not 1 <= contract.max_attempts <= MAX_ATTEMPTS_LIMIT:
        violations.append(FieldViolation("contract.max_attempts", f"must be between 1 and {MAX_ATTEMPTS_LIMIT}"))
    if not 1 <= contract.lease_seconds <= LEASE_SECONDS_LIMIT:
        violations.append(FieldViolation("contract.lease_seconds", f"must be between 1 and {LEASE_SECONDS_LIMIT}"))
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
        violations.append(FieldViolation("contract.allowed_recovery", "QUERY_THEN_RETRY needs queryable"))
    if contract.effect_class == EffectClass.RETRYABLE_WITH_KEY and not contract.provider_idempotency:
        violations.append(
            FieldViolation("contract.provider_idempotency", "RETRYABLE_WITH_KEY needs provider_idempotency")
        )
    if len(contract.default_estimate) > ESTIMATE_DIMENSIONS_MAX:
        violations.append(FieldViolation("contract.default_estimate", f"at most {ESTIMATE_DIMENSIONS_MAX} dimensions"))
    for dimension, amount in sorted(contract.default_estimate.items()):
        if not DIMENSION.fullmatch(dimension):
            violations.append(
                FieldViolation("contract.default_estimate", f"{dimension[:70]!r} is not a valid dimension name")
            )
        elif not 0 <= amount <= INT64_MAX:
            violations.append(
                FieldViolation(f"contract.default_estimate.{dimension}", f"is {amount}; must be between 0 and 2^63-1")
            )
    if contract.arguments_schema is not None:
        field_name = "contract.arguments_schema_json"
        if schema_problems is None:
            violations += schema_violations(contract.arguments_schema, field_name)
        else:
            violations += [FieldViolation(field_name, problem) for problem in schema_problems]
    if violations:
        raise InvalidArgument(
            "; ".join(f"{v.field}: {v.description}" for v in violations),
            reason="INVALID_TOOL_CONTRACT",
            violations=violations,
        )
