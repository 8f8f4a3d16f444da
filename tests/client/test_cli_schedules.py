"""effect-ledger-ctl's ``schedules`` group against a real server: schedules made by an agent
through the client, listed, shown and cancelled by operators, and due intents watched as the
server's scheduler fires them."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from effect_ledger_client.cli import _data
from effect_ledger_client.proto import budgets_pb2, schedules_pb2
from support import contract

from .conftest import register
from .test_cli import ARGUMENTS, Cli, assert_one_line_error, header, postgres_only

# The scheduler fires every second by default; a due intent reaches a watcher within ~1.5 s.
WATCH_SECONDS = "15"


@pytest.fixture
def cli(server, tenant, monkeypatch, capsys) -> Cli:
    if "operator" not in tenant.tokens:
        tenant.add("operator", "operator")
    return Cli(server, tenant, monkeypatch, capsys)


def schedule(ledger, run_id: str, key: str, **fields) -> schedules_pb2.Schedule:
    fields.setdefault("purpose", schedules_pb2.DELAYED_RETRY)
    return ledger.schedules.ScheduleIntent(
        schedules_pb2.ScheduleIntentRequest(
            run_id=run_id,
            tool="email.send",
            arguments_json=json.dumps(ARGUMENTS).encode(),
            idempotency_key=key,
            target="mailto:bob@example.com",
            **fields,
        )
    )


@postgres_only
def test_schedules_list_show_and_cancel(cli, ledger, admin_ledger, run_id):
    estimated = contract()
    estimated.contract.default_estimate["usd_micros"] = 40
    admin_ledger.tools.PutToolContract(estimated)
    admin_ledger.budgets.PutBudget(
        budgets_pb2.PutBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id, dimension="usd_micros", limit=100)
    )
    held = schedule(ledger, run_id, "k-held", delay_seconds=3600, hold_budget=True, note="after the rate limit")
    later = schedule(
        ledger,
        run_id,
        "k-later",
        delay_seconds=7200,
        purpose=schedules_pb2.RATE_LIMIT,
        cancel_conditions=[schedules_pb2.CANCEL_WHEN_EFFECT_SUCCEEDED],
    )

    table = cli.process("operator", "schedules", "list", "--run", run_id)
    assert header(table) == [
        "SCHEDULE",
        "RUN",
        "KEY",
        "TOOL",
        "PURPOSE",
        "STATE",
        "NOT",
        "BEFORE",
        "DEADLINE",
        "RESERVATION",
    ]
    rows = [line.split() for line in table.lines()[1:]]  # newest first
    assert [r[:6] for r in rows] == [
        [later.schedule_id, run_id, "k-later", "email.send", "RATE_LIMIT", "SCHEDULED"],
        [held.schedule_id, run_id, "k-held", "email.send", "DELAYED_RETRY", "SCHEDULED"],
    ]
    assert rows[1][-1] == "usd_micros=40" and len(rows[0]) == 7  # no deadline, no reservation

    listed = cli.process("auditor", "schedules", "list", "--state", "scheduled", "-o", "json").json()
    assert [s["schedule_id"] for s in listed] == [later.schedule_id, held.schedule_id]
    assert listed[1]["arguments_json"] == ARGUMENTS and listed[1]["reservation"] == {"usd_micros": 40}
    assert listed[0]["cancel_conditions"] == ["CANCEL_WHEN_EFFECT_SUCCEEDED"] and listed[0]["clock"] == "database"

    shown = cli.process("auditor", "schedules", "show", held.schedule_id)
    for name, value in (
        ("schedule_id", held.schedule_id),
        ("idempotency_key", "k-held"),
        ("state", "SCHEDULED"),
        ("note", "after the rate limit"),
        ("created_by", "agent"),
        ("clock", "database"),
    ):
        assert re.search(rf"^{name} +{re.escape(value)} *$", shown.stdout, re.MULTILINE), name
    assert re.search(r'^arguments_json +\{"subject":"hello","to":"bob@example.com"\} *$', shown.stdout, re.M)
    as_yaml = yaml.safe_load(cli.call("auditor", "schedules", "show", held.schedule_id, "-o", "yaml").stdout)
    assert as_yaml["not_before"] and as_yaml["intent_digest"] and as_yaml["tool_revision"] == 1
    assert as_yaml["reservation"] == {"usd_micros": 40} and as_yaml["due_sequence"] == 0

    assert_one_line_error(cli.call("operator", "schedules", "cancel", held.schedule_id, expect=2), 2)  # --reason
    cancelled = cli.process(
        "operator", "schedules", "cancel", held.schedule_id, "--reason", "the customer called", "-o", "json"
    ).json()
    assert (cancelled["state"], cancelled["closed_by"], cancelled["close_reason"]) == (
        "SCHEDULE_CANCELLED",
        "operator",
        "the customer called",
    )
    assert cancelled["closed_at"]
    budget = admin_ledger.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.RUN, scope_id=run_id))
    assert budget.budgets[0].pending == 0  # the hold was released

    again = cli.call("operator", "schedules", "cancel", held.schedule_id, "--reason", "twice", expect=6)
    assert assert_one_line_error(again, 6).startswith("error: FAILED_PRECONDITION (SCHEDULE_CLOSED): ")
    by_auditor = cli.call("auditor", "schedules", "cancel", later.schedule_id, "--reason", "no", expect=7)
    assert_one_line_error(by_auditor, 7)
    missing = cli.call("auditor", "schedules", "show", "sch_00000000000000000000000000000000", expect=4)
    assert assert_one_line_error(missing, 4).startswith("error: NOT_FOUND (SCHEDULE_NOT_FOUND): ")

    assert cli.call("auditor", "schedules", "list", "--state", "Schedule_Cancelled", "-o", "ids").lines() == [
        held.schedule_id
    ]
    assert cli.call("auditor", "schedules", "list", "--run", run_id, "--state", "DUE", "-o", "ids").stdout == ""
    assert "no schedules" in cli.call("auditor", "schedules", "list", "--state", "DUE").stderr
    paged = cli.call("auditor", "schedules", "list", "--limit", "1", "--page-size", "1", "-o", "ids")
    assert paged.lines() == [later.schedule_id] and "--limit 1" in paged.stderr


@postgres_only
def test_a_bad_schedule_state_is_one_line_and_nothing_is_sent(cli):
    bad = cli.process("auditor", "schedules", "list", "--state", "SOMETIMES", expect=2)
    line = assert_one_line_error(bad, 2)
    assert "--state" in line and "SOMETIMES" in line and "schedules list --help" in line
    assert_one_line_error(cli.call("auditor", "schedules", "watch", "--after-sequence", "-1", expect=2), 2)
    assert_one_line_error(cli.call("auditor", "schedules", "show", expect=2), 2)


@postgres_only
def test_schedules_watch_prints_each_intent_as_it_falls_due(cli, ledger, admin_ledger, run_id):
    register(admin_ledger)
    scheduled = schedule(ledger, run_id, "k-soon", delay_seconds=1)

    watched = cli.process(
        "auditor", "schedules", "watch", "--run", run_id, "--max-events", "1", "--seconds", WATCH_SECONDS, "-o", "json"
    )
    (line,) = watched.lines()
    due = json.loads(line)
    assert due["sequence"] >= 1 and due["schedule"]["schedule_id"] == scheduled.schedule_id
    assert due["schedule"]["state"] == "DUE" and due["schedule"]["fired_by"] and due["schedule"]["due_at"]
    assert due["schedule"]["arguments_json"] == ARGUMENTS  # JSON, not base64

    # Resumed from a sequence: a second intent, and only it, after the first one's sequence.
    second = schedule(ledger, run_id, "k-next", delay_seconds=1, purpose=schedules_pb2.RECOVERY_CHECK)
    after = str(due["sequence"])
    table = cli.call(
        "operator",
        "schedules",
        "watch",
        "--run",
        run_id,
        "--after-sequence",
        after,
        "--max-events",
        "1",
        "--seconds",
        WATCH_SECONDS,
    )
    (row,) = table.lines()
    assert row.split()[:7] == [
        str(due["sequence"] + 1),
        second.schedule_id,
        run_id,
        "k-next",
        "email.send",
        "RECOVERY_CHECK",
        "DUE",
    ]
    everything = cli.call("auditor", "schedules", "watch", "--run", run_id, "--seconds", "1", "-o", "ids")
    assert everything.lines() == [scheduled.schedule_id, second.schedule_id]
    assert cli.call("auditor", "schedules", "list", "--state", "due", "--run", run_id, "-o", "ids").lines() == [
        second.schedule_id,
        scheduled.schedule_id,
    ]


def test_a_schedules_json_fields_are_json_values():
    message = schedules_pb2.DueIntent(sequence=3, schedule=schedules_pb2.Schedule(arguments_json=b'{"to":"bob"}'))
    data = _data.message_to_data(message)
    assert data["schedule"]["arguments_json"] == {"to": "bob"} and data["sequence"] == 3
    assert _data.message_to_data(schedules_pb2.Schedule())["arguments_json"] is None
