"""Budget arithmetic: reservations before spending, settlements after.

Per budget and dimension, at every instant: ``posted + pending <= limit`` for everything the
gate reserves. The database enforces it (a conditional UPDATE per budget row); these functions
decide what to reserve, post and void, and validate amounts. ``RecordUsage`` is a fact: it is
posted even when it crosses the limit, and the budget then reads exhausted.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from effect_ledger.errors import FieldViolation, InvalidArgument

INT64_MAX = 2**63 - 1
DIMENSION = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
STANDARD_DIMENSIONS = frozenset({"usd_micros", "tokens_in", "tokens_out", "tool_calls"})
ESTIMATE_DIMENSIONS_MAX = 16


class Scope(enum.StrEnum):
    TENANT = "TENANT"
    RUN = "RUN"
    RUN_TREE = "RUN_TREE"


class ReservationState(enum.StrEnum):
    PENDING = "PENDING"
    POSTED = "POSTED"
    VOIDED = "VOIDED"
    EXPIRED = "EXPIRED"


@dataclass(frozen=True)
class Budget:
    budget_id: str
    scope: Scope
    scope_id: str
    dimension: str
    limit: int
    posted: int
    pending: int
    reset_period_seconds: int | None
    period_started_at: datetime
    period_ends_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @property
    def available(self) -> int:
        return max(self.limit - self.posted - self.pending, 0)

    @property
    def exhausted(self) -> bool:
        return self.posted + self.pending >= self.limit

    def as_policy_fact(self, estimate: int) -> dict[str, Any]:
        return {
            "budget_id": self.budget_id,
            "scope": self.scope.value,
            "scope_id": self.scope_id,
            "dimension": self.dimension,
            "limit": self.limit,
            "posted": self.posted,
            "pending": self.pending,
            "available": self.available,
            "estimate": estimate,
        }


@dataclass(frozen=True)
class Reservation:
    reservation_id: str
    budget_id: str
    attempt_id: str
    effect_id: str
    dimension: str
    amount: int
    state: ReservationState
    posted_amount: int
    created_at: datetime
    settled_at: datetime | None


def check_dimension(name: str, field: str) -> str:
    if not DIMENSION.fullmatch(name):
        raise InvalidArgument.field(
            field, f"dimension {name[:70]!r} must match [a-z][a-z0-9_]{{0,63}}", reason="INVALID_DIMENSION"
        )
    return name


def check_amount(value: int, field: str, *, allow_zero: bool = True) -> int:
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidArgument.field(field, "must not be negative", reason="NEGATIVE_AMOUNT")
    if value > INT64_MAX:
        raise InvalidArgument.field(field, "exceeds a 64-bit integer", reason="AMOUNT_OVERFLOW")
    return value


def validate_amounts(
    amounts: dict[str, int], field: str, known_dimensions: frozenset[str], *, keep_zero: bool = False
) -> dict[str, int]:
    """Validate a dimension -> amount map (an estimate, or reported usage where 0 is a fact)."""
    if len(amounts) > ESTIMATE_DIMENSIONS_MAX:
        raise InvalidArgument.field(
            field, f"at most {ESTIMATE_DIMENSIONS_MAX} dimensions", reason="TOO_MANY_DIMENSIONS"
        )
    violations = []
    for dimension, amount in sorted(amounts.items()):
        if not DIMENSION.fullmatch(dimension):
            violations.append(FieldViolation(f"{field}[{dimension[:70]!r}]", "not a valid dimension name"))
        elif dimension not in known_dimensions:
            violations.append(
                FieldViolation(f"{field}[{dimension!r}]", "unknown dimension: no budget of the tenant defines it")
            )
        elif amount < 0:
            violations.append(FieldViolation(f"{field}[{dimension!r}]", "must not be negative"))
        elif amount > INT64_MAX:
            violations.append(FieldViolation(f"{field}[{dimension!r}]", "exceeds a 64-bit integer"))
    if violations:
        reason = "NEGATIVE_AMOUNT" if any("negative" in v.description for v in violations) else "INVALID_DIMENSION"
        raise InvalidArgument(
            "; ".join(f"{v.field}: {v.description}" for v in violations), reason=reason, violations=violations
        )
    return {dimension: amount for dimension, amount in amounts.items() if amount > 0 or keep_zero}


# Every attempt is one tool call, unless its contract says otherwise (``tool_calls: 0``).
IMPLICIT_FLOOR = {"tool_calls": 1}


def estimate_floor(contract_default: dict[str, int]) -> dict[str, int]:
    """What every attempt of a tool counts at least, whatever its caller says: the contract's
    ``default_estimate``, and one tool call unless the contract names ``tool_calls`` (a tool
    that really costs nothing says ``tool_calls: 0``)."""
    return {**IMPLICIT_FLOOR, **contract_default}


def merged_estimate(requested: dict[str, int], contract_default: dict[str, int]) -> dict[str, int]:
    """The estimate reserved on ALLOW: the request may raise the contract's floor, never lower it."""
    floor = estimate_floor(contract_default)
    merged = {}
    for dimension in sorted(floor.keys() | requested.keys()):
        asked = requested.get(dimension, 0)
        # A negative amount stays as asked, for validate_amounts to refuse by its field.
        merged[dimension] = asked if asked < 0 else max(floor.get(dimension, 0), asked)
    return merged


def floored_usage(usage: dict[str, int], contract_default: dict[str, int]) -> dict[str, int]:
    """Reported usage, raised to the contract's floor in each dimension it names."""
    floor = estimate_floor(contract_default)
    return {dimension: max(amount, floor.get(dimension, 0)) for dimension, amount in usage.items()}


def reservations_needed(budgets: list[Budget], estimate: dict[str, int]) -> list[tuple[Budget, int]]:
    """(budget, amount) for every applicable budget whose dimension the estimate names.

    Sorted by budget id: every writer locks budget rows in this order (no deadlock cycle).
    """
    return sorted(
        ((budget, estimate[budget.dimension]) for budget in budgets if estimate.get(budget.dimension, 0) > 0),
        key=lambda pair: pair[0].budget_id,
    )


def settle_amount(reservation: Reservation, reported_usage: dict[str, int] | None) -> int:
    """What a SUCCEEDED attempt posts for one reservation: the reported usage, else the estimate."""
    if reported_usage is not None and reservation.dimension in reported_usage:
        return reported_usage[reservation.dimension]
    return reservation.amount


def posting_overflows(budget: Budget, amount: int) -> bool:
    return budget.posted + amount > INT64_MAX
