"""Values the options take: the proto enums' names as choices, instants and durations."""

from __future__ import annotations

import enum
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import timestamp_pb2

from effect_ledger_client.proto import approvals_pb2, budgets_pb2, common_pb2, schedules_pb2


class Output(enum.StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"
    # One identifier a line: for shell variables and loops.
    IDS = "ids"


# The choices mirror the proto enums without their UNSPECIFIED value (the option left out means
# "any"); tests/client/test_cli.py checks that they name the same values.
class Stage(enum.StrEnum):
    AUTHORIZED = "AUTHORIZED"
    DISPATCHED = "DISPATCHED"
    UNKNOWN = "UNKNOWN"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    RELEASED = "RELEASED"


class Outcome(enum.StrEnum):
    ALLOW = "ALLOW"
    DENY = "DENY"
    REQUIRE_APPROVAL = "REQUIRE_APPROVAL"
    DUPLICATE = "DUPLICATE"
    RECONCILE_REQUIRED = "RECONCILE_REQUIRED"


class ApprovalState(enum.StrEnum):
    PENDING = "PENDING"
    APPROVED = "APPROVED"
    DENIED = "DENIED"
    REVOKED = "REVOKED"
    CONSUMED = "CONSUMED"
    EXPIRED = "EXPIRED"


class BudgetScope(enum.StrEnum):
    TENANT = "TENANT"
    RUN = "RUN"
    RUN_TREE = "RUN_TREE"


class ScheduleState(enum.StrEnum):
    SCHEDULED = "SCHEDULED"
    DUE = "DUE"
    SCHEDULE_CONSUMED = "SCHEDULE_CONSUMED"
    SCHEDULE_CANCELLED = "SCHEDULE_CANCELLED"
    SCHEDULE_EXPIRED = "SCHEDULE_EXPIRED"


# Each choice enum, and the proto enum it mirrors. A request takes the choice's value, the name.
PROTO_ENUMS = {
    Stage: common_pb2.Stage,
    Outcome: common_pb2.Outcome,
    ApprovalState: approvals_pb2.ApprovalState,
    BudgetScope: budgets_pb2.BudgetScope,
    ScheduleState: schedules_pb2.ScheduleState,
}


DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
SECONDS_PER_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# A year and a day: a longer duration is a typo rather than an intent.
DURATION_SECONDS_MAX = 366 * 86400


class BadValue(ValueError):
    """A value an option cannot take: a usage error, reported before anything is sent."""


def duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``2h``, ``7d``."""
    match = DURATION.match(text.strip())
    if match is None:
        raise BadValue(f"{text!r} is not a duration (a number and s, m, h or d: 15m, 2h, 7d)")
    seconds = float(match.group(1)) * SECONDS_PER_UNIT[match.group(2)]
    if seconds > DURATION_SECONDS_MAX:
        raise BadValue(f"{text!r} is longer than {DURATION_SECONDS_MAX // 86400} days")
    return timedelta(seconds=seconds)


def instant(text: str, *, now: datetime | None = None, ago: bool = True) -> datetime:
    """An ISO 8601 instant (UTC when it names no offset), ``now``, or a duration: that long
    before now (``ago``) or after it."""
    now = now or datetime.now(UTC)
    stripped = text.strip()
    if stripped == "now":
        return now
    if DURATION.match(stripped):
        return now - duration(stripped) if ago else now + duration(stripped)
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        raise BadValue(
            f"{text!r} is neither an ISO 8601 instant (2026-05-01T09:30:00Z) nor a duration (15m, 2h, 7d)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(moment.astimezone(UTC))
    return value


def created_range(request: Any, since: str | None, until: str | None) -> None:
    """Sets ``created_after`` and ``created_before`` of a list request from --since and --until."""
    for option, text, field in (("--since", since, "created_after"), ("--until", until, "created_before")):
        if text:
            try:
                getattr(request, field).CopyFrom(timestamp(instant(text)))
            except BadValue as error:
                raise BadValue(f"{option}: {error}") from None
