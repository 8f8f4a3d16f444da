"""effect-ledger-ctl against a real server: every command group run as a real process (the
installed console script), checking its table and its JSON; cheaper variations run the same
entry point in this process. Failures are one line on standard error with a documented exit
code, never a traceback."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from effect_ledger_client import __version__
from effect_ledger_client.cli import _app, _data, _values
from effect_ledger_client.cli._app import EXIT_CODE_BY_ERROR, run
from effect_ledger_client.errors import CLASS_BY_CODE
from effect_ledger_client.proto import (
    approvals_pb2,
    budgets_pb2,
    checkpoints_pb2,
    common_pb2,
    gate_pb2,
    principals_pb2,
    runs_pb2,
    tools_pb2,
)
from support import ServerProcess, authorize_request, contract, new_run, new_tenant, reload_policy, succeeded, unknown

from .conftest import IRREVERSIBLE_TOOL, register, register_irreversible

REPO = Path(__file__).resolve().parents[2]
CLI_DOC = REPO / "docs" / "cli.md"
CTL = Path(sys.executable).parent / "effect-ledger-ctl"
PROCESS_SECONDS_MAX = 30
ENVIRONMENT_VARIABLES = [
    "EFFECT_LEDGER_SERVER",
    "EFFECT_LEDGER_TOKEN",
    "EFFECT_LEDGER_TOKEN_FILE",
    "EFFECT_LEDGER_CA_FILE",
    "EFFECT_LEDGER_CERT_FILE",
    "EFFECT_LEDGER_KEY_FILE",
    "EFFECT_LEDGER_TIMEOUT",
    "EFFECT_LEDGER_OUTPUT",
]
ARGUMENTS = {"to": "bob@example.com", "subject": "hello"}

# The command talks gRPC, whatever the server stores in: these tests use the PostgreSQL server.
postgres_only = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def lines(self) -> list[str]:
        return self.stdout.splitlines()


def clean_environment(**extra: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
    return {**environment, **extra}


def assert_one_line_error(result: Result, code: int, starts: str = "error: ") -> str:
    assert result.code == code, (result.code, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(starts), line
    return line


class Cli:
    """effect-ledger-ctl as one of the tenant's principals: ``process`` runs the installed
    script, ``call`` the same entry point in this process."""

    def __init__(self, server, tenant, monkeypatch, capsys) -> None:
        self.server, self.tenant, self.monkeypatch, self.capsys = server, tenant, monkeypatch, capsys

    def process(self, principal: str | None, *args: str, expect: int | None = 0, **environment: str) -> Result:
        token = {"EFFECT_LEDGER_TOKEN": self.tenant.tokens[principal]} if principal else {}
        done = subprocess.run(
            [str(CTL), *args],
            capture_output=True,
            text=True,
            timeout=PROCESS_SECONDS_MAX,
            check=False,
            env=clean_environment(EFFECT_LEDGER_SERVER=self.server.target, **token, **environment),
        )
        result = Result(done.returncode, done.stdout, done.stderr)
        assert expect is None or result.code == expect, (result.code, result.stderr)
        return result

    def call(
        self,
        principal: str | None,
        *args: str,
        expect: int | None = 0,
        token: str | None = None,
        stdin: str = "",
        **environment: str,
    ) -> Result:
        self.monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        for name in ENVIRONMENT_VARIABLES:
            self.monkeypatch.delenv(name, raising=False)
        for name, value in {"EFFECT_LEDGER_SERVER": self.server.target, **environment}.items():
            self.monkeypatch.setenv(name, value)
        if token or principal:
            self.monkeypatch.setenv("EFFECT_LEDGER_TOKEN", token or self.tenant.tokens[principal])
        self.capsys.readouterr()
        code = run(list(args))
        printed = self.capsys.readouterr()
        result = Result(code, printed.out, printed.err)
        assert expect is None or result.code == expect, (result.code, result.stderr)
        return result


@pytest.fixture
def cli(server, tenant, monkeypatch, capsys) -> Cli:
    if "operator" not in tenant.tokens:
        tenant.add("operator", "operator")
    return Cli(server, tenant, monkeypatch, capsys)


def dispatched(ledger, run_id: str, key: str, **fields) -> gate_pb2.AuthorizeEffectResponse:
    request = authorize_request(run_id, key, arguments=json.dumps(ARGUMENTS).encode(), **fields)
    request.begin_dispatched = True
    allowed = ledger.gate.AuthorizeEffect(request)
    assert common_pb2.Outcome.Name(allowed.outcome) == "ALLOW"
    return allowed


def unknown_effect(ledger, run_id: str, key: str) -> str:
    allowed = dispatched(ledger, run_id, key)
    ledger.gate.RecordOutcome(unknown(allowed.attempt_id))
    return allowed.effect_id


def succeeded_effect(ledger, run_id: str, key: str) -> str:
    allowed = dispatched(ledger, run_id, key)
    ledger.gate.RecordOutcome(succeeded(allowed.attempt_id, "msg-1", b'{"status":"sent"}'))
    return allowed.effect_id


def header(result: Result) -> list[str]:
    return result.lines()[0].split()


# --- effects ------------------------------------------------------------------------------------


@postgres_only
def test_effects_list_show_and_reconcile(cli, ledger, admin_ledger, run_id, tmp_path):
    register(admin_ledger)
    sent = succeeded_effect(ledger, run_id, "k-sent")
    uncertain = unknown_effect(ledger, run_id, "k-unknown")  # (the gate refuses a new effect on its target)

    table = cli.process("operator", "effects", "list", "--stage", "UNKNOWN")
    assert header(table) == ["EFFECT", "STAGE", "TOOL", "RUN", "TARGET", "ATTEMPTS", "UPDATED"]
    (row,) = table.lines()[1:]
    assert row.split()[:5] == [uncertain, "UNKNOWN", "email.send", run_id, "mailto:bob@example.com"]

    listed = cli.process("operator", "effects", "list", "--run", run_id, "-o", "json").json()
    assert [e["effect_id"] for e in listed] == [sent, uncertain]
    second, first = listed
    assert first["arguments_json"] == ARGUMENTS and first["stage"] == "UNKNOWN" and first["tool_revision"] == 1
    assert first["attempts"][0]["outcome_reason"] == "connection reset after sending" and "receipt" not in first
    assert second["receipt"]["detail_json"] == {"status": "sent"} and second["receipt"]["provider_reference"] == "msg-1"
    assert second["attempts"][0]["receipt"]["detail_json"] == {"status": "sent"}

    settled = cli.process(
        "operator", "effects", "reconcile", uncertain, "--not-happened", "--reason", "no such message", "-o", "json"
    ).json()
    assert (settled["stage"], settled["reconciled_by"], settled["reconcile_reason"]) == (
        "FAILED",
        "operator",
        "no such message",
    )
    assert cli.call("operator", "effects", "list", "--stage", "UNKNOWN", "-o", "ids").stdout == ""

    # With a receipt from a YAML file; the detail is a mapping, never base64.
    other = unknown_effect(ledger, run_id, "k-unknown-2")
    receipt = tmp_path / "receipt.yaml"
    receipt.write_text("provider_reference: msg-8841\ndetail_json:\n  status: sent\n  attempts: 2\n")
    done = cli.call("operator", "effects", "reconcile", other, "--receipt-file", str(receipt), "-o", "json").json()
    assert done["stage"] == "SUCCEEDED" and done["receipt"]["provider_reference"] == "msg-8841"
    assert done["receipt"]["detail_json"] == {"status": "sent", "attempts": 2}

    shown = cli.call("auditor", "effects", "show", other)
    assert re.search(rf"^effect_id +{other} *$", shown.stdout, re.MULTILINE)
    assert "ATTEMPT" in shown.stdout and f"{other}.1" in shown.stdout  # the attempts table, its provider key
    assert cli.call("auditor", "effects", "list", "--since", "1h", "--until", "2999-01-01", "-o", "ids").lines() == [
        sent,
        uncertain,
        other,
    ]
    assert cli.call("auditor", "effects", "list", "--since", "2999-01-01T00:00:00Z", "-o", "ids").stdout == ""
    paged = cli.call("auditor", "effects", "list", "--limit", "2", "--page-size", "1", "-o", "ids")
    assert paged.lines() == [sent, uncertain] and "--limit 2" in paged.stderr


@postgres_only
def test_reconcile_takes_one_kind_of_evidence(cli):
    line = assert_one_line_error(cli.call("operator", "effects", "reconcile", "eff_x", expect=2), 2)
    assert "--receipt-json, --receipt-file or --not-happened" in line
    assert_one_line_error(cli.call("operator", "effects", "reconcile", "eff_x", "--not-happened", expect=2), 2)
    both = cli.call(
        "operator",
        "effects",
        "reconcile",
        "eff_x",
        "--receipt-json",
        '{"provider_reference": "r"}',
        "--not-happened",
        "--reason",
        "x",
        expect=2,
    )
    assert_one_line_error(both, 2)
    not_a_receipt = cli.call("operator", "effects", "reconcile", "eff_x", "--receipt-json", "[1, 2]", expect=2)
    assert "mapping of Receipt fields" in assert_one_line_error(not_a_receipt, 2)


# --- approvals ----------------------------------------------------------------------------------


@postgres_only
def test_approvals_list_watch_and_decide(cli, ledger, admin_ledger, run_id):
    register_irreversible(admin_ledger)
    asked = ledger.gate.AuthorizeEffect(
        authorize_request(run_id, "wire-1", tool=IRREVERSIBLE_TOOL, arguments=b'{"amount":5}', target="acct:1")
    )
    approval_id = asked.approval_request_id
    assert approval_id

    table = cli.process("reviewer", "approvals", "list", "--state", "pending")
    assert header(table)[:3] == ["APPROVAL", "STATE", "TOOL"]
    (row,) = table.lines()[1:]
    assert row.split()[:4] == [approval_id, "PENDING", IRREVERSIBLE_TOOL, run_id]

    watched = cli.process("auditor", "approvals", "watch", "--run", run_id, "--max-events", "1", "-o", "json")
    (line,) = watched.lines()
    event = json.loads(line)
    assert (event["sequence"], event["type"], event["principal_id"]) == (1, "approval.requested", "agent")
    assert event["approval"]["approval_id"] == approval_id and event["approval"]["arguments_json"] == {"amount": 5}

    approved = cli.process("reviewer", "approvals", "approve", approval_id, "--reason", "checked", "-o", "json").json()
    assert approved["state"] == "APPROVED"
    assert [(v["reviewer_id"], v["approve"], v["comment"]) for v in approved["votes"]] == [
        ("reviewer", True, "checked")
    ]

    lines = cli.call("auditor", "approvals", "watch", "--run", run_id, "--seconds", "1").lines()
    assert [line.split()[:3] for line in lines] == [
        ["1", "approval.requested", approval_id],
        ["2", "approval.approved", approval_id],
    ]
    assert cli.call("auditor", "approvals", "watch", "--from-now", "--seconds", "1").lines() == []  # no history
    # From now on: requests made while the command runs (one every 0.3 s until it prints one).
    watching: dict[str, Any] = {}
    watcher = threading.Thread(
        target=lambda: watching.update(
            done=cli.process(
                "auditor", "approvals", "watch", "--from-now", "--max-events", "1", "--seconds", "20", "-o", "json"
            )
        )
    )
    watcher.start()
    made: list[str] = []
    while watcher.is_alive() and len(made) < 60:
        made.append(
            ledger.gate.AuthorizeEffect(
                authorize_request(
                    run_id,
                    f"wire-now-{len(made)}",
                    tool=IRREVERSIBLE_TOOL,
                    arguments=json.dumps({"amount": 100 + len(made)}).encode(),  # a request per intent
                    target="acct:1",
                )
            ).approval_request_id
        )
        watcher.join(0.3)
    watcher.join()
    (line,) = watching["done"].lines()
    event = json.loads(line)
    assert event["type"] == "approval.requested" and event["approval"]["approval_id"] in made
    shown = yaml.safe_load(cli.call("auditor", "approvals", "show", approval_id, "-o", "yaml").stdout)
    assert shown["state"] == "APPROVED" and shown["arguments_json"] == {"amount": 5} and shown["quorum"] == 1
    revoked = cli.call("admin", "approvals", "revoke", approval_id, "--reason", "changed", "-o", "json").json()
    assert (revoked["state"], revoked["revoked_by"], revoked["revoke_reason"]) == ("REVOKED", "admin", "changed")

    other = ledger.gate.AuthorizeEffect(
        authorize_request(run_id, "wire-2", tool=IRREVERSIBLE_TOOL, arguments=b'{"amount":7}', target="acct:1")
    ).approval_request_id
    assert_one_line_error(cli.call("reviewer", "approvals", "deny", other, expect=2), 2)  # --reason is required
    denied = cli.call("reviewer", "approvals", "deny", other, "--reason", "too much", "-o", "ids")
    assert denied.stdout == f"{other}\n"
    assert cli.call("auditor", "approvals", "list", "--state", "DENIED", "-o", "ids").lines() == [other]


# --- budgets ------------------------------------------------------------------------------------


@postgres_only
def test_budgets_put_list_and_show(cli, run_id):
    tenant_budget = cli.call(
        "admin", "budgets", "put", "TENANT", "--dimension", "tool_calls", "--limit", "100", "-o", "ids"
    ).stdout.strip()
    run_budget = cli.process("admin", "budgets", "put", "run", run_id, "--dimension", "usd_micros", "--limit", "0")
    assert "budget_id" in run_budget.stdout and "usd_micros" in run_budget.stdout

    table = cli.process("auditor", "budgets", "list")
    assert header(table)[:2] == ["BUDGET", "SCOPE"]
    rows = [line.split() for line in table.lines()[1:]]
    assert rows[0][:3] == [tenant_budget, "TENANT", "tool_calls"]
    assert rows[1][1:4] == ["RUN", run_id, "usd_micros"]

    (exhausted,) = cli.process("auditor", "budgets", "list", "--exhausted", "-o", "json").json()
    assert {
        k: exhausted[k]
        for k in (
            "scope",
            "scope_id",
            "dimension",
            "limit",
            "posted",
            "pending",
            "available",
            "exhausted",
            "reset_period_seconds",
        )
    } == {
        "scope": "RUN",
        "scope_id": run_id,
        "dimension": "usd_micros",
        "limit": 0,
        "posted": 0,
        "pending": 0,
        "available": 0,
        "exhausted": True,
        "reset_period_seconds": 0,
    }
    assert cli.call("auditor", "budgets", "list", "--scope", "TENANT", "-o", "ids").lines() == [tenant_budget]
    assert cli.call(
        "auditor", "budgets", "list", "--run", run_id, "--dimension", "usd_micros", "-o", "ids"
    ).lines() == [exhausted["budget_id"]]
    scope = cli.call("auditor", "budgets", "show", "RUN", run_id, "-o", "json").json()
    assert [b["budget_id"] for b in scope["budgets"]] == [exhausted["budget_id"]] and scope["open_reservations"] == []
    assert_one_line_error(cli.call("auditor", "budgets", "show", "TENANT", run_id, expect=2), 2)
    assert_one_line_error(cli.call("auditor", "budgets", "show", "RUN", expect=2), 2)


# --- tools --------------------------------------------------------------------------------------

CONTRACT_YAML = """\
tool: email.send
effect_class: RETRYABLE_WITH_KEY
provider_idempotency: true
allowed_recovery: [RETRY_SAME_KEY]
max_attempts: 3
lease_seconds: 60
default_estimate: {usd_micros: 5}
arguments_schema_json:
  type: object
  required: [to]
  properties:
    to: {type: string}
"""


@postgres_only
def test_tools_put_list_show_and_retire(cli, tmp_path):
    contract_file = tmp_path / "contract.yaml"
    contract_file.write_text(CONTRACT_YAML)
    put = cli.process("admin", "tools", "put", "-f", str(contract_file), "-o", "json").json()
    assert {
        k: put[k]
        for k in (
            "tool",
            "revision",
            "effect_class",
            "allowed_recovery",
            "max_attempts",
            "lease_seconds",
            "default_estimate",
            "created_by",
            "retired",
        )
    } == {
        "tool": "email.send",
        "revision": 1,
        "effect_class": "RETRYABLE_WITH_KEY",
        "allowed_recovery": ["RETRY_SAME_KEY"],
        "max_attempts": 3,
        "lease_seconds": 60,
        "default_estimate": {"usd_micros": 5},
        "created_by": "admin",
        "retired": False,
    }
    assert put["arguments_schema_json"] == yaml.safe_load(CONTRACT_YAML)["arguments_schema_json"]

    table = cli.process("auditor", "tools", "list")
    assert header(table)[:2] == ["TOOL", "REVISION"]
    assert table.lines()[1].split()[:4] == ["email.send", "1", "RETRYABLE_WITH_KEY", "RETRY_SAME_KEY"]

    # What `show -o yaml` prints goes back in unchanged: the same contract, no new revision.
    shown = tmp_path / "shown.yaml"
    shown.write_text(cli.call("auditor", "tools", "show", "email.send", "-o", "yaml").stdout)
    assert cli.call("admin", "tools", "put", "-f", str(shown), "-o", "json").json()["revision"] == 1
    wrapped = json.dumps({"contract": {**yaml.safe_load(CONTRACT_YAML), "lease_seconds": 90}})
    refused = cli.call("admin", "tools", "put", "-f", "-", "--expected-revision", "0", stdin=wrapped, expect=6)
    assert assert_one_line_error(refused, 6).startswith("error: FAILED_PRECONDITION (REVISION_MISMATCH): ")
    put_again = cli.call("admin", "tools", "put", "-f", "-", "--expected-revision", "1", "-o", "json", stdin=wrapped)
    assert put_again.json()["revision"] == 2

    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(CONTRACT_YAML.replace("arguments_schema_json", "arguments_schema"))
    assert "arguments_schema" in assert_one_line_error(
        cli.call("admin", "tools", "put", "-f", str(misspelt), expect=2), 2
    )

    retired = cli.call("admin", "tools", "retire", "email.send", "--reason", "replaced", "-o", "json").json()
    assert (retired["retired"], retired["retired_reason"], retired["revision"]) == (True, "replaced", 3)
    assert cli.call("auditor", "tools", "list", "-o", "ids").stdout == ""
    assert cli.call("auditor", "tools", "list", "--include-retired", "-o", "ids").lines() == ["email.send"]
    assert (
        cli.call("auditor", "tools", "show", "email.send", "--revision", "1", "-o", "json").json()["lease_seconds"]
        == 60
    )


# --- runs ---------------------------------------------------------------------------------------


@postgres_only
def test_runs_list_show_and_trace(cli, ledger, admin_ledger):
    register(admin_ledger)
    run_id = ledger.runs.CreateRun(runs_pb2.CreateRunRequest(labels={"ticket": "4711"})).run_id
    effect_id = succeeded_effect(ledger, run_id, "k-trace")

    table = cli.process("auditor", "runs", "list", "--label", "ticket=4711")
    assert header(table)[0] == "RUN"
    (row,) = table.lines()[1:]
    assert row.split()[0] == run_id and "ticket=4711" in row

    events = cli.process("auditor", "runs", "trace", run_id, "-o", "json").json()
    assert [e["revision"] for e in events] == list(range(1, len(events) + 1))
    assert [e["type"] for e in events][:2] == ["run.created", "effect.authorized"]
    assert events[0]["prev_hash"] == "" and all(
        later["prev_hash"] == earlier["hash"] for earlier, later in zip(events, events[1:], strict=False)
    )
    assert events[1]["payload_json"]["effect_id"] == effect_id  # JSON, not base64
    assert events[0]["payload_json"]["labels"] == {"ticket": "4711"}

    traced = cli.call("auditor", "runs", "trace", run_id)
    assert header(traced)[:2] == ["REVISION", "TYPE"]
    assert [line.split()[1] for line in traced.lines()[1:]] == [e["type"] for e in events]  # one line each
    shown = cli.call("auditor", "runs", "show", run_id, "-o", "json").json()
    assert shown["labels"] == {"ticket": "4711"} and shown["head_hash"] == events[-1]["hash"]
    first = cli.call("auditor", "runs", "trace", run_id, "--limit", "1", "-o", "ids")
    assert first.lines() == ["1"] and "--after-revision 1" in first.stderr
    assert cli.call("auditor", "runs", "list", "--label", "ticket=4712", "-o", "ids").stdout == ""


# --- decisions ----------------------------------------------------------------------------------


@postgres_only
def test_decisions_list_show_and_replay(cli, ledger, admin_ledger, run_id):
    register(admin_ledger)
    allowed = dispatched(ledger, run_id, "k-allowed")
    admin_ledger.tools.RetireTool(tools_pb2.RetireToolRequest(tool="email.send", reason="replaced"))
    denied = ledger.gate.AuthorizeEffect(authorize_request(run_id, "k-denied"))
    assert common_pb2.Outcome.Name(denied.outcome) == "DENY"

    table = cli.process("auditor", "decisions", "list", "--run", run_id)
    assert header(table)[:3] == ["DECISION", "OUTCOME", "REASONS"]
    rows = [line.split() for line in table.lines()[1:]]
    assert [r[:2] for r in rows] == [[allowed.decision_id, "ALLOW"], [denied.decision_id, "DENY"]]
    assert "TOOL_RETIRED" in rows[1]

    shown = cli.process("auditor", "decisions", "show", allowed.decision_id, "-o", "json").json()
    assert (shown["decision_id"], shown["outcome"], shown["effect_id"]) == (
        allowed.decision_id,
        "ALLOW",
        allowed.effect_id,
    )
    assert shown["input_json"]["request"]["arguments"] == ARGUMENTS  # the policy input, as JSON

    side_by_side = cli.process("auditor", "decisions", "replay", allowed.decision_id)
    assert side_by_side.lines()[1].split() == ["RECORDED", "NOW", "CHANGED"]
    outcome_row = next(line.split() for line in side_by_side.lines() if line.startswith("outcome"))
    assert outcome_row == ["outcome", "ALLOW", "ALLOW", "no"]
    assert allowed.policy_revision in side_by_side.stdout

    replay = cli.call("auditor", "decisions", "replay", allowed.decision_id, "-o", "json").json()
    assert (replay["outcome"], replay["outcome_changed"], replay["policy_changed"]) == ("ALLOW", False, False)
    assert replay["recorded"]["input_json"]["request"]["arguments"] == ARGUMENTS
    assert replay["package"] == "effectledger/gate" and replay["policy_revision"] == allowed.policy_revision

    assert cli.call("auditor", "decisions", "list", "--outcome", "deny", "-o", "ids").lines() == [denied.decision_id]
    assert cli.call(
        "auditor", "decisions", "list", "--reason", "TOOL_RETIRED", "--tool", "email.send", "-o", "ids"
    ).lines() == [denied.decision_id]


# A rule added to the shipped gate policy: the replay of an earlier ALLOW now answers DENY.
NO_EMAIL_TO_BOB = """package effectledger.gate

import rego.v1

deny contains reason("BOB_IS_BLOCKED", "mail to bob is blocked by this deployment") if {
	input.request.target == "mailto:bob@example.com"
}
"""


@pytest.fixture
def changing_policy_server(pg_url):
    """A server of its own on a copy of the policy folder, which the test changes (SIGHUP)."""
    folder = Path(tempfile.mkdtemp(prefix="el-policy-")) / "policy"
    shutil.copytree(REPO / "policy", folder)
    server = ServerProcess(pg_url, ["--policy-dir", str(folder)]).start()
    try:
        yield server, folder
    finally:
        server.stop()
        shutil.rmtree(folder.parent, ignore_errors=True)


@pytest.mark.postgres
def test_decisions_replay_after_a_policy_change_shows_both_answers(changing_policy_server, pg_url, monkeypatch, capsys):
    server, folder = changing_policy_server
    tenant = new_tenant(pg_url)
    cli = Cli(server, tenant, monkeypatch, capsys)
    tenant.client(server, "admin").tools.PutToolContract(contract("email.send"))
    agent = tenant.client(server, "agent")
    allowed = agent.gate.AuthorizeEffect(authorize_request(new_run(agent), "k-before-change"))
    assert common_pb2.Outcome.Name(allowed.outcome) == "ALLOW"

    (folder / "effectledger" / "gate" / "bob.rego").write_text(NO_EMAIL_TO_BOB)
    reload_policy(server)

    side_by_side = cli.process("auditor", "decisions", "replay", allowed.decision_id)
    assert side_by_side.lines()[1].split() == ["RECORDED", "NOW", "CHANGED"]
    # One row per field: its name, the recorded answer, the answer now, and whether it changed.
    rows = [line.split() for line in side_by_side.lines()[2:6]]
    assert [row[0] for row in rows] == ["outcome", "reasons", "policy", "engine"], side_by_side.stdout
    assert rows[0] == ["outcome", "ALLOW", "DENY", "yes"]
    assert rows[1][-1] == "yes" and "BOB_IS_BLOCKED" in rows[1][2:-1] and "BOB_IS_BLOCKED" not in rows[1][1]
    assert rows[2][:3] == ["policy", "revision", allowed.policy_revision] and rows[2][-1] == "yes"
    assert rows[2][3] != allowed.policy_revision
    added = next(line.split() for line in side_by_side.lines() if line.startswith("reasons added"))
    assert added[2:] == ["BOB_IS_BLOCKED"]

    replay = cli.call("auditor", "decisions", "replay", allowed.decision_id, "-o", "json").json()
    assert (replay["outcome"], replay["outcome_changed"], replay["policy_changed"]) == ("DENY", True, True)
    assert replay["recorded"]["outcome"] == "ALLOW"
    assert replay["recorded"]["policy_revision"] == allowed.policy_revision != replay["policy_revision"]
    assert "BOB_IS_BLOCKED" in replay["reasons_added"]
    assert "BOB_IS_BLOCKED" in {reason["code"] for reason in replay["reasons"]}


# --- principals ---------------------------------------------------------------------------------


@postgres_only
def test_principals_list_rotate_disable_enable_and_expire(cli, tenant):
    table = cli.process("admin", "principals", "list")
    assert header(table)[:2] == ["PRINCIPAL", "ROLES"]
    rows = {line.split()[0]: line.split()[1:3] for line in table.lines()[1:]}
    assert rows == {
        "admin": ["admin", "enabled"],
        "agent": ["agent", "enabled"],
        "auditor": ["auditor", "enabled"],
        "operator": ["operator", "enabled"],
        "reviewer": ["reviewer", "enabled"],
    }

    old_token = tenant.tokens["agent"]
    new_token = cli.process("admin", "principals", "rotate", "agent", "-o", "ids").stdout.strip()
    assert new_token.startswith("elt_") and new_token != old_token
    refused = cli.call(None, "principals", "list", token=old_token, expect=8)
    assert assert_one_line_error(refused, 8).startswith("error: UNAUTHENTICATED")
    assert cli.call(None, "principals", "list", "-o", "ids", token=new_token).lines() == ["agent"]  # itself only

    disabled = cli.process("admin", "principals", "disable", "agent", "-o", "json").json()
    assert disabled["principal_id"] == "agent" and disabled["disabled_at"]
    assert_one_line_error(cli.call(None, "principals", "list", token=new_token, expect=8), 8)
    enabled = cli.call("admin", "principals", "enable", "agent", "-o", "json").json()
    assert "disabled_at" not in enabled
    cli.call(None, "principals", "list", token=new_token)

    expiring = cli.call("admin", "principals", "expire", "agent", "--in", "1h", "-o", "json").json()
    assert expiring["token_expires_at"]
    assert "token_expires_at" not in cli.call("admin", "principals", "expire", "agent", "--never", "-o", "json").json()
    assert_one_line_error(cli.call("admin", "principals", "expire", "agent", expect=2), 2)
    cannot = cli.call("admin", "principals", "disable", "admin", expect=6)
    assert assert_one_line_error(cannot, 6).startswith("error: FAILED_PRECONDITION (")


# --- the command itself -------------------------------------------------------------------------


@postgres_only
def test_help_names_every_environment_variable_and_default(cli):
    shown = cli.process(None, "effects", "list", "--help")
    squashed = re.sub(r"[\s│]", "", shown.stdout)  # rich may fold a long line inside its box
    for name in ENVIRONMENT_VARIABLES:
        assert name in squashed, name
    assert "127.0.0.1:50051" in squashed and "default:table" in squashed and "default:1000" in squashed


@postgres_only
def test_version(cli):
    assert cli.process(None, "--version").stdout == f"effect-ledger-ctl {__version__} (effectledger.v1)\n"


@postgres_only
def test_the_token_from_a_file(cli, tenant, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(tenant.tokens["auditor"] + "\n")
    listed = cli.process(None, "principals", "list", "--token-file", str(token_file), "-o", "ids")
    assert listed.lines() == ["auditor"]
    # From the environment; one given on the command line wins over it.
    by_environment = cli.process(
        None,
        "principals",
        "list",
        "-o",
        "ids",
        expect=2,
        EFFECT_LEDGER_TOKEN_FILE=str(token_file),
        EFFECT_LEDGER_TOKEN="elt_wrong",
    )
    assert "not both" in assert_one_line_error(by_environment, 2)
    on_line = cli.process(
        None,
        "principals",
        "list",
        "-o",
        "ids",
        "--token",
        tenant.tokens["admin"],
        EFFECT_LEDGER_TOKEN_FILE=str(token_file),
    )
    assert len(on_line.lines()) == 5
    missing = cli.process(None, "principals", "list", "--token-file", str(tmp_path / "nothing"), expect=2)
    assert "nothing" in assert_one_line_error(missing, 2)
    assert "no token" in assert_one_line_error(cli.process(None, "principals", "list", expect=2), 2)


@postgres_only
def test_a_server_error_is_one_line_with_its_exit_code(cli):
    missing = cli.process("auditor", "effects", "show", "eff_00000000000000000000000000000000", expect=4)
    line = assert_one_line_error(missing, 4)
    assert line.startswith("error: NOT_FOUND (EFFECT_NOT_FOUND): ") and "eff_00000000000000000000000000000000" in line
    refused = cli.call("auditor", "tools", "retire", "email.send", expect=7)
    assert assert_one_line_error(refused, 7).startswith("error: PERMISSION_DENIED (ROLE_REQUIRED): ")


@postgres_only
def test_a_bad_value_is_one_line_and_nothing_is_sent(cli, tmp_path):
    bad = cli.process("auditor", "effects", "list", "--stage", "SOMETIMES", expect=2)
    assert "--stage" in assert_one_line_error(bad, 2)
    assert "--since" in assert_one_line_error(
        cli.call("auditor", "effects", "list", "--since", "yesterday", expect=2), 2
    )
    assert_one_line_error(cli.call("auditor", "effects", "list", "--timeout", "0", expect=2), 2)
    assert_one_line_error(cli.call("auditor", "effects", "list", "--limit", "0", expect=2), 2)
    assert_one_line_error(cli.call("auditor", "effects", "lst", expect=2), 2)
    broken = tmp_path / "broken.yaml"
    broken.write_text("tool: [unclosed\n")
    assert_one_line_error(cli.call("admin", "tools", "put", "-f", str(broken), expect=2), 2)
    cert = tmp_path / "client.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    alone = cli.call("auditor", "effects", "list", "--cert-file", str(cert), expect=2)
    assert "--key-file" in assert_one_line_error(alone, 2)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from e2e.test_tls import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def mtls_server(pki, sqlite_url):
    from e2e.test_tls import TlsServerProcess, credentials, tls_flags

    running = TlsServerProcess(
        sqlite_url,
        [*tls_flags(pki), "--tls-client-ca", pki.path("ca.pem")],
        channel_credentials=credentials(pki, "client"),
    ).start()
    yield running
    running.stop()


def test_tls_options(mtls_server, pki, sqlite_url, monkeypatch, capsys):
    tenant = new_tenant(sqlite_url)
    cli = Cli(type("Tls", (), {"target": f"localhost:{mtls_server.port}"})(), tenant, monkeypatch, capsys)
    files = [
        "--ca-file",
        pki.path("ca.pem"),
        "--cert-file",
        pki.path("client.pem"),
        "--key-file",
        pki.path("client-key.pem"),
    ]
    assert cli.process("auditor", "principals", "list", *files, "-o", "ids").lines() == ["auditor"]
    by_environment = cli.call(
        "auditor",
        "principals",
        "list",
        "-o",
        "ids",
        EFFECT_LEDGER_CA_FILE=pki.path("ca.pem"),
        EFFECT_LEDGER_CERT_FILE=pki.path("client.pem"),
        EFFECT_LEDGER_KEY_FILE=pki.path("client-key.pem"),
    )
    assert by_environment.lines() == ["auditor"]
    no_client_certificate = cli.call(
        "auditor", "principals", "list", "--timeout", "2", "--ca-file", pki.path("ca.pem"), expect=11
    )
    assert_one_line_error(no_client_certificate, 11)


@postgres_only
def test_an_unreachable_server_is_unavailable(cli):
    cli.server = type("Nowhere", (), {"target": "127.0.0.1:1"})()
    result = cli.call(None, "effects", "list", "--timeout", "1", token="elt_any", expect=11)
    assert assert_one_line_error(result, 11).startswith("error: UNAVAILABLE")


def test_without_the_extra_the_command_says_what_to_install(monkeypatch, capsys):
    from effect_ledger_client import cli as package

    monkeypatch.delitem(sys.modules, "effect_ledger_client.cli._app")
    monkeypatch.setitem(sys.modules, "typer", None)
    assert package.main(["--version"]) == package.EXIT_MISSING_EXTRA
    (line,) = capsys.readouterr().err.splitlines()
    assert "effect-ledger-client[cli]" in line


def test_exit_codes_are_the_documented_ones():
    section = CLI_DOC.read_text().split("<!-- exit-codes -->")[1]
    documented = {int(code): name for code, name in re.findall(r"^\| (\d+) \| `?([A-Za-z_ ]+?)`? \|", section, re.M)}
    for error_class, code in EXIT_CODE_BY_ERROR.items():
        status = next(s for s, c in CLASS_BY_CODE.items() if c is error_class)
        assert documented.get(code) == status.name, (code, status.name)
    assert {_app.EXIT_OK, _app.EXIT_FAILURE, _app.EXIT_USAGE, _app.EXIT_OTHER_STATUS, _app.EXIT_INTERRUPTED} <= set(
        documented
    )
    assert len(set(EXIT_CODE_BY_ERROR.values())) == len(EXIT_CODE_BY_ERROR)


def test_the_choices_mirror_the_proto_enums():
    for choice, proto_enum in _values.PROTO_ENUMS.items():
        names = [value.name for value in proto_enum.DESCRIPTOR.values]
        assert [c.value for c in choice] == [n for n in names if not n.endswith("_UNSPECIFIED")]


# --- messages as data ---------------------------------------------------------------------------

MODULES = [approvals_pb2, budgets_pb2, checkpoints_pb2, common_pb2, gate_pb2, principals_pb2, runs_pb2, tools_pb2]


def json_fields() -> list[tuple[type, str]]:
    """Every bytes field named *_json of every message of the protos, nested messages included."""
    found = []

    def visit(descriptor, message_class) -> None:
        for field in descriptor.fields:
            if _data.is_json_field(field):
                found.append((message_class, field.name))
        for nested in descriptor.nested_types:
            if not nested.GetOptions().map_entry:
                visit(nested, getattr(message_class, nested.name))

    for module in MODULES:
        for name, descriptor in module.DESCRIPTOR.message_types_by_name.items():
            visit(descriptor, getattr(module, name))
    return found


@pytest.mark.parametrize(("message_class", "field"), json_fields(), ids=lambda v: getattr(v, "__name__", v))
def test_every_json_bytes_field_is_a_json_value_both_ways(message_class, field):
    message = message_class(**{field: b'{"to":["bob@example.com"],"amount":5}'})
    data = _data.message_to_data(message)
    assert data[field] == {"to": ["bob@example.com"], "amount": 5}
    assert _data.data_to_message(data, message_class, "test") == message
    assert _data.message_to_data(message_class())[field] is None


def test_nested_json_fields_are_decoded():
    receipt = common_pb2.Receipt(provider_reference="msg-1", detail_json=b'{"status":"sent"}')
    effect = gate_pb2.Effect(receipt=receipt, attempts=[gate_pb2.Attempt(receipt=receipt)], arguments_json=b"{}")
    data = _data.message_to_data(effect)
    assert data["receipt"]["detail_json"] == data["attempts"][0]["receipt"]["detail_json"] == {"status": "sent"}
    replay = _data.message_to_data(gate_pb2.ReplayDecisionResponse(recorded=gate_pb2.Decision(input_json=b"[1]")))
    assert replay["recorded"]["input_json"] == [1]
    event = _data.message_to_data(approvals_pb2.ApprovalEvent(approval=approvals_pb2.Approval(arguments_json=b"{}")))
    assert event["approval"]["arguments_json"] == {}
    assert _data.message_to_data(budgets_pb2.Budget(limit=2**40))["limit"] == 2**40  # a number, not a string


def test_a_grpc_status_without_details_still_reads_well():
    error = CLASS_BY_CODE[grpc.StatusCode.UNAVAILABLE]("connection refused", code=grpc.StatusCode.UNAVAILABLE)
    assert _app.error_line(error) == "UNAVAILABLE: connection refused"
    assert _app.exit_code_of(error) == 11
