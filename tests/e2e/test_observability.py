"""Logs, metrics and traces (docs/observability.md), against real servers.

- The JSON log: one access line per call, unary and streaming, refused ones included (a failed
  login, a permission denial, a stream the servicer aborts), each with the request id the
  caller sent or one the server made, which the trailing metadata carries back; every line of
  the log is JSON, the standard library's too.
- /metrics over real HTTP after a scripted run: exact counts of RPCs, decisions and policy
  evaluations, the pool's size, the sampled open and UNKNOWN effects and the pending approval
  request with its age; the policy errors when OPA is down; with ``--workers 2``, the
  supervisor's endpoint adds up both workers.
- Traces: an in-process server with an in-memory exporter; AuthorizeEffect's server span with
  the policy evaluation and the database transaction under it. The same from ``serve
  --otel-exporter console``, read from the server's standard output.
- OPA unreachable: the server logs the cause with the call's request id and counts the engine's
  error; the client is not told.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid

import grpc
import pytest
from opa_standin import OpaStandIn
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from effect_ledger.config import ServerSettings
from effect_ledger.observability import tracing
from effect_ledger.policy.embedded import EmbeddedRegoEngine
from effect_ledger.policy.engine import default_policy_dir
from effect_ledger.storage.engine import Database, DatabaseSettings, create_async
from effect_ledger.transport.server import start_server
from effectledger.v1 import (
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    common_pb2,
    gate_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
    tools_pb2_grpc,
)
from support import (
    ServerProcess,
    authorize_request,
    contract,
    create_pg_database,
    drop_pg_database,
    migrate,
    new_tenant,
    unknown,
)

pytestmark = pytest.mark.postgres

AUTHORIZE = "effectledger.v1.Gate/AuthorizeEffect"
PUT_CONTRACT = "effectledger.v1.ToolRegistry/PutToolContract"
CREATE_RUN = "effectledger.v1.Runs/CreateRun"
RECORD_OUTCOME = "effectledger.v1.Gate/RecordOutcome"
IRREVERSIBLE_TOOL = "payment.wire"
METRICS_URL = re.compile(r"serving metrics on (http://[^ \"]+/metrics)")
WAIT_SECONDS = 10.0


class Caller:
    """Calls with a token and, when given, an ``x-request-id``; what came back, trailers too."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        self.gate = gate_pb2_grpc.GateStub(self.channel)
        self.runs = runs_pb2_grpc.RunsStub(self.channel)
        self.tools = tools_pb2_grpc.ToolRegistryStub(self.channel)
        self.checkpoints = checkpoints_pb2_grpc.CheckpointsStub(self.channel)
        self.schedules = schedules_pb2_grpc.SchedulesStub(self.channel)

    def unary(self, method, request, token: str, request_id: str | None = None):
        """(response or None, trailing metadata, status code name)."""
        metadata = [("authorization", f"Bearer {token}")]
        if request_id is not None:
            metadata.append(("x-request-id", request_id))
        try:
            response, call = method.with_call(request, metadata=metadata, timeout=10)
            return response, dict(call.trailing_metadata()), "OK"
        except grpc.RpcError as error:
            return None, dict(error.trailing_metadata() or ()), error.code().name

    def close(self) -> None:
        self.channel.close()


def log_lines(server: ServerProcess) -> list[dict]:
    """Every line of the server's log, each one JSON (a line that is not fails the test)."""
    lines = []
    for line in server.log_path.read_text(errors="replace").splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line in the server's log: {line!r}") from None
    return lines


def access_lines(server: ServerProcess) -> list[dict]:
    return [line for line in log_lines(server) if line.get("logger") == "effect_ledger.access"]


def wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_SECONDS} s: {what}")
        time.sleep(0.05)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        assert answer.status == 200
        text = answer.read().decode("utf-8")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def metrics_url(server: ServerProcess) -> str:
    return wait_for(lambda: (METRICS_URL.search(server.log()) or [None, None])[1], "the metrics endpoint is logged")


# --- logs ------------------------------------------------------------------------------------


def test_one_access_line_per_call_with_its_request_id(pg_url):
    server = ServerProcess(pg_url, ["--log-format", "json"]).start()
    caller = Caller(server.target)
    try:
        tenant = new_tenant(pg_url)
        admin, agent = tenant.tokens["admin"], tenant.tokens["agent"]
        prefix = uuid.uuid4().hex[:8]
        names = ("contract", "run", "authorize", "deny", "login", "denied", "export")
        sent = {name: f"{prefix}-{name}" for name in names}
        answers = {}
        answers["contract"] = caller.unary(caller.tools.PutToolContract, contract(), admin, sent["contract"])
        answers["run"] = caller.unary(caller.runs.CreateRun, runs_pb2.CreateRunRequest(), agent, sent["run"])
        run_id = answers["run"][0].run_id
        answers["authorize"] = caller.unary(
            caller.gate.AuthorizeEffect, authorize_request(run_id, f"k-{prefix}"), agent, sent["authorize"]
        )
        answers["deny"] = caller.unary(
            caller.gate.AuthorizeEffect,
            authorize_request(run_id, f"k3-{prefix}", tool="no.such"),
            agent,
            sent["deny"],
        )
        answers["login"] = caller.unary(
            caller.gate.AuthorizeEffect, authorize_request(run_id, f"k2-{prefix}"), "not-a-token", sent["login"]
        )
        answers["denied"] = caller.unary(caller.tools.PutToolContract, contract(), agent, sent["denied"])
        # No request id: the server makes one; one that is too long is replaced by one of its own.
        answers["unnamed"] = caller.unary(caller.runs.CreateRun, runs_pb2.CreateRunRequest(), agent)
        answers["too-long"] = caller.unary(caller.runs.CreateRun, runs_pb2.CreateRunRequest(), agent, "x" * 129)
        # A server stream its servicer aborts (NOT_FOUND), after authenticating.
        stream = caller.checkpoints.ExportCheckpoint(
            checkpoints_pb2.ExportCheckpointRequest(checkpoint_id="ckpt_missing"),
            metadata=[("authorization", f"Bearer {agent}"), ("x-request-id", sent["export"])],
            timeout=10,
        )
        with pytest.raises(grpc.RpcError) as aborted:
            list(stream)
        export_code = aborted.value.code().name
        answers["export"] = (None, dict(aborted.value.trailing_metadata() or ()), export_code)

        codes = {name: answer[2] for name, answer in answers.items()}
        assert codes == {
            "contract": "OK",
            "run": "OK",
            "authorize": "OK",
            "deny": "OK",
            "login": "UNAUTHENTICATED",
            "denied": "PERMISSION_DENIED",
            "unnamed": "OK",
            "too-long": "OK",
            "export": "NOT_FOUND",
        }
        returned = {name: answer[1].get("x-request-id") for name, answer in answers.items()}
        for name, request_id in sent.items():
            assert returned[name] == request_id, (name, returned)
        assert re.fullmatch(r"[0-9a-f]{16}", returned["unnamed"])
        assert re.fullmatch(r"[0-9a-f]{16}", returned["too-long"])

        lines = wait_for(
            lambda: (found := access_lines(server)) and len(found) >= len(answers) and found, "access lines"
        )
        assert len(lines) == len(answers), lines  # health checks are not logged
        by_id = {line["request_id"]: line for line in lines}
        assert set(by_id) == set(returned.values())
        decision = answers["authorize"][0]
        tenant_name = tenant.name
        expected = {
            "contract": (PUT_CONTRACT, "OK", None, tenant_name, "admin"),
            "run": (CREATE_RUN, "OK", None, tenant_name, "agent"),
            "authorize": (AUTHORIZE, "OK", None, tenant_name, "agent"),
            "deny": (AUTHORIZE, "OK", None, tenant_name, "agent"),
            "login": (AUTHORIZE, "UNAUTHENTICATED", "TOKEN_UNKNOWN", "", ""),
            "denied": (PUT_CONTRACT, "PERMISSION_DENIED", "ROLE_REQUIRED", tenant_name, "agent"),
            "unnamed": (CREATE_RUN, "OK", None, tenant_name, "agent"),
            "too-long": (CREATE_RUN, "OK", None, tenant_name, "agent"),
            "export": (
                "effectledger.v1.Checkpoints/ExportCheckpoint",
                "NOT_FOUND",
                "CHECKPOINT_NOT_FOUND",
                tenant_name,
                "agent",
            ),
        }
        for name, (method, code, reason, tenant_id, principal) in expected.items():
            line = by_id[returned[name]]
            seen = (line["method"], line["code"], line.get("reason"), line["tenant"], line["principal"])
            assert seen == (method, code, reason, tenant_id, principal), (name, line)
            assert line["level"] == "info" and isinstance(line["duration_ms"], float)
        authorized = by_id[sent["authorize"]]
        assert (authorized["decision_id"], authorized["outcome"]) == (decision.decision_id, "ALLOW")
        assert authorized.get("reasons", []) == [r.code for r in decision.reasons]
        # A refusal's line names the decision's reason codes; ``reason`` stays the error's.
        refusal = answers["deny"][0]
        denial = by_id[sent["deny"]]
        assert common_pb2.Outcome.Name(refusal.outcome) == "DENY" and refusal.reasons
        assert (denial["decision_id"], denial["outcome"]) == (refusal.decision_id, "DENY")
        assert denial["reasons"] == [r.code for r in refusal.reasons]
        assert "reason" not in denial
        assert "decision_id" not in by_id[sent["login"]]
        # The standard library's lines (start-up) are rendered by the same JSON renderer.
        assert any(line.get("logger") == "effect_ledger.transport.server" for line in log_lines(server))
    finally:
        caller.close()
        server.stop()


def test_a_policy_failure_logs_its_cause_and_tells_the_client_none_of_it(pg_url):
    with OpaStandIn(default_policy_dir()) as standin:
        server = ServerProcess(
            pg_url,
            [
                "--log-format",
                "json",
                "--opa-url",
                standin.url,
                "--opa-timeout-seconds",
                "0.5",
                "--metrics-listen",
                "127.0.0.1:0",
            ],
        ).start()
        caller = Caller(server.target)
        try:
            tenant = new_tenant(pg_url)
            caller.unary(caller.tools.PutToolContract, contract(), tenant.tokens["admin"])
            agent = tenant.tokens["agent"]
            run_id = caller.unary(caller.runs.CreateRun, runs_pb2.CreateRunRequest(), agent)[0].run_id
            standin.set_mode("stopped")
            request_id = f"opa-down-{uuid.uuid4().hex[:8]}"
            metadata = [("authorization", f"Bearer {agent}"), ("x-request-id", request_id)]
            with pytest.raises(grpc.RpcError) as refused:
                caller.gate.AuthorizeEffect(authorize_request(run_id, "k-opa"), metadata=metadata, timeout=10)
            error = refused.value
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert dict(error.trailing_metadata())["x-request-id"] == request_id

            def failure():
                return next(
                    (
                        line
                        for line in log_lines(server)
                        if line.get("event") == "call failed" and line.get("request_id") == request_id
                    ),
                    None,
                )

            line = wait_for(failure, "the failure's log line")
            port = standin.url.rstrip("/").rsplit(":", 1)[1]
            assert line["level"] == "warning" and line["reason"] == "POLICY_UNAVAILABLE"
            assert line["method"] == AUTHORIZE
            assert port in line["cause"], line  # the connection that failed, named
            told = error.details() + repr(error.trailing_metadata())
            assert line["cause"] not in told and port not in told
            # The status is sent as the call aborts; its access line is written as it ends.
            access = wait_for(
                lambda: [a for a in access_lines(server) if a["request_id"] == request_id], "the access line"
            )
            assert [(a["code"], a["reason"]) for a in access] == [("UNAVAILABLE", "POLICY_UNAVAILABLE")]
            # Counted once, as the engine's failure (the contract and the run needed no policy).
            samples = scrape(metrics_url(server))
            errors = "effect_ledger_policy_evaluation_errors_total"
            failed = {labels: value for (name, labels), value in samples.items() if name == errors}
            assert failed == {(("engine", "opa-remote"), ("reason", "POLICY_UNAVAILABLE")): 1.0}, failed
            assert sample(samples, "effect_ledger_rpcs_total", method=AUTHORIZE, code="UNAVAILABLE") == 1
        finally:
            caller.close()
            server.stop()


# --- metrics ---------------------------------------------------------------------------------


def test_metrics_count_a_scripted_run():
    # A database of its own: no other server's scheduler fires the schedule this one counts.
    database = create_pg_database("el_metrics")
    migrate(database)
    server = ServerProcess(
        database,
        ["--metrics-listen", "127.0.0.1:0", "--metrics-sample-interval-seconds", "0.2"],
    ).start()
    caller = Caller(server.target)
    try:
        url = wait_for(lambda: (METRICS_URL.search(server.log()) or [None, None])[1], "the metrics endpoint")
        tenant = new_tenant(database)
        admin, agent = tenant.tokens["admin"], tenant.tokens["agent"]
        assert caller.unary(caller.tools.PutToolContract, contract(), admin)[2] == "OK"
        irreversible = contract(
            IRREVERSIBLE_TOOL, effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False, max_attempts=1
        )
        assert caller.unary(caller.tools.PutToolContract, irreversible, admin)[2] == "OK"
        run_id = caller.unary(caller.runs.CreateRun, runs_pb2.CreateRunRequest(), agent)[0].run_id
        allowed = [
            caller.unary(caller.gate.AuthorizeEffect, authorize_request(run_id, f"k{n}"), agent)[0] for n in range(3)
        ]
        outcomes = [answer.outcome for answer in allowed]
        # One of them ends UNKNOWN (still open); an IRREVERSIBLE tool's call waits for an approval.
        assert caller.unary(caller.gate.RecordOutcome, unknown(allowed[0].attempt_id), agent)[2] == "OK"
        waiting = caller.unary(
            caller.gate.AuthorizeEffect, authorize_request(run_id, "k-wire", tool=IRREVERSIBLE_TOOL), agent
        )[0]
        assert common_pb2.Outcome.Name(waiting.outcome) == "REQUIRE_APPROVAL" and waiting.approval_request_id
        approval_reason = waiting.reasons[0].code
        denied = caller.unary(caller.gate.AuthorizeEffect, authorize_request(run_id, "k-deny", tool="no.such"), agent)[
            0
        ]
        assert caller.unary(caller.tools.PutToolContract, contract(), agent)[2] == "PERMISSION_DENIED"
        assert outcomes == [1, 1, 1] and denied.outcome == 2  # ALLOW x3, DENY
        deny_reason = denied.reasons[0].code
        scheduled = schedules_pb2.ScheduleIntentRequest(
            run_id=run_id,
            tool="email.send",
            arguments_json=b"{}",
            idempotency_key="k-later",
            target="mailto:bob@example.com",
            purpose=schedules_pb2.DELAYED_RETRY,
            delay_seconds=1,
        )
        assert caller.unary(caller.schedules.ScheduleIntent, scheduled, agent)[2] == "OK"

        samples = wait_for(
            lambda: (
                (found := scrape(url))
                and sample(found, "effect_ledger_effects_open", tenant=tenant.name) == 3
                and sample(found, "effect_ledger_effects_unknown", tenant=tenant.name) == 1
                and sample(found, "effect_ledger_approval_requests_pending", tenant=tenant.name) == 1
                and sample(found, "effect_ledger_scheduled_intents_moved_total", state="DUE") == 1
                and found
            ),
            "the sampled open and UNKNOWN effects, the pending approval request and the fired schedule",
        )
        rpcs = "effect_ledger_rpcs_total"
        assert sample(samples, rpcs, method=AUTHORIZE, code="OK") == 5
        assert sample(samples, rpcs, method=RECORD_OUTCOME, code="OK") == 1
        assert sample(samples, rpcs, method=PUT_CONTRACT, code="OK") == 2
        assert sample(samples, rpcs, method=PUT_CONTRACT, code="PERMISSION_DENIED") == 1
        assert sample(samples, rpcs, method=CREATE_RUN, code="OK") == 1
        assert sample(samples, "effect_ledger_rpc_duration_seconds_count", method=AUTHORIZE) == 5
        assert sample(samples, "effect_ledger_decisions_total", outcome="ALLOW", reason="") == 3
        assert sample(samples, "effect_ledger_decisions_total", outcome="DENY", reason=deny_reason) == 1
        decisions = "effect_ledger_decisions_total"
        assert sample(samples, decisions, outcome="REQUIRE_APPROVAL", reason=approval_reason) == 1
        evaluations = sample(
            samples,
            "effect_ledger_policy_evaluation_duration_seconds_count",
            engine="embedded-regorus",
            package="effectledger/gate",
        )
        # The ALLOWs, and the approval's once or twice (PostgreSQL's fast path evaluates, then hands
        # the filing of the request to the general path); the unknown tool may be refused first.
        assert 4 <= evaluations <= 6
        # The sampler reads the age from the database clock, after the request was made.
        age = sample(samples, "effect_ledger_approval_requests_oldest_pending_age_seconds", tenant=tenant.name)
        assert 0 <= age < 300, age
        assert ("effect_ledger_approval_requests_oldest_pending_age_seconds", (("tenant", tenant.name),)) in samples
        assert sample(samples, "effect_ledger_database_pool_size_connections") == 10
        assert sample(samples, "effect_ledger_database_pool_checked_out_connections") <= 10
    finally:
        caller.close()
        server.stop()
        drop_pg_database(database)


@pytest.mark.multiprocess
def test_metrics_of_two_workers_add_up(pg_url):
    server = ServerProcess(pg_url, ["--metrics-listen", "127.0.0.1:0", "--log-format", "json"], workers=2).start()
    callers: list[Caller] = []
    try:
        url = metrics_url(server)
        tenant = new_tenant(pg_url)
        agent = tenant.tokens["agent"]
        # A connection of its own per caller: the kernel spreads them over the two workers.
        callers = [Caller(server.target) for _ in range(12)]
        for caller in callers:
            assert caller.unary(caller.runs.CreateRun, runs_pb2.CreateRunRequest(), agent)[2] == "OK"
        served_by = {line["worker"] for line in access_lines(server) if line["method"] == CREATE_RUN}
        assert served_by == {0, 1}, served_by
        samples = scrape(url)
        assert sample(samples, "effect_ledger_rpcs_total", method=CREATE_RUN, code="OK") == len(callers)
        assert sample(samples, "effect_ledger_rpc_duration_seconds_count", method=CREATE_RUN) == len(callers)
        assert sample(samples, "effect_ledger_database_pool_size_connections") == 20  # 2 x 10
    finally:
        for caller in callers:
            caller.close()
        server.stop()


# --- traces ----------------------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="session")
async def test_authorize_effect_is_traced_with_policy_and_transaction_spans(pg_url):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tenant = new_tenant(pg_url)
    tracing.install(provider)
    try:
        database = Database(create_async(DatabaseSettings(pg_url, pool_size=2)))
        running = await start_server(
            ServerSettings(listen="127.0.0.1:0", database_url=pg_url),
            database,
            EmbeddedRegoEngine(default_policy_dir()),
            sweep_leases=False,
        )
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                admin = (("authorization", f"Bearer {tenant.tokens['admin']}"),)
                agent = (("authorization", f"Bearer {tenant.tokens['agent']}"),)
                await tools_pb2_grpc.ToolRegistryStub(channel).PutToolContract(contract(), metadata=admin, timeout=10)
                run = await runs_pb2_grpc.RunsStub(channel).CreateRun(
                    runs_pb2.CreateRunRequest(), metadata=agent, timeout=10
                )
                exporter.clear()
                answer = await gate_pb2_grpc.GateStub(channel).AuthorizeEffect(
                    authorize_request(run.run_id, "k-traced"),
                    metadata=(*agent, ("x-request-id", "traced-1")),
                    timeout=10,
                )
                assert answer.outcome == 1  # ALLOW
        finally:
            await running.stop(0)
    finally:
        tracing.install(None)
    spans = exporter.get_finished_spans()
    (server_span,) = [s for s in spans if s.name == f"/{AUTHORIZE}"]
    assert server_span.attributes["effect_ledger.request_id"] == "traced-1"
    assert server_span.attributes["rpc.method"] == "AuthorizeEffect"
    by_id = {s.context.span_id: s for s in spans}

    def descends_from_server_span(span) -> bool:
        while span.parent is not None:
            if span.parent.span_id == server_span.context.span_id:
                return True
            span = by_id.get(span.parent.span_id)
            if span is None:
                return False
        return False

    names = {
        s.name for s in spans if s.context.trace_id == server_span.context.trace_id and descends_from_server_span(s)
    }
    assert {"policy.evaluate", "db.transaction"} <= names, names
    (evaluation,) = [s for s in spans if s.name == "policy.evaluate"]
    assert evaluation.attributes["effect_ledger.policy.outcome"] == "ALLOW"


def json_objects(text: str) -> list:
    """The JSON values in ``text``, one after another (the console exporter's spans span several
    lines; log lines are one each); a line that starts none is skipped."""
    decoder = json.JSONDecoder()
    found, position = [], 0
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError:
            line_end = text.find("\n", position)
            position = len(text) if line_end < 0 else line_end + 1
        else:
            found.append(value)
    return found


def test_the_console_exporter_writes_the_authorize_effect_span_with_its_children(pg_url):
    # Spans are exported in batches: every 50 ms here; unbuffered, each span is one write.
    server = ServerProcess(
        pg_url,
        ["--otel-exporter", "console", "--log-format", "json"],
        env={"OTEL_BSP_SCHEDULE_DELAY": "50", "PYTHONUNBUFFERED": "1"},
    ).start()
    caller = Caller(server.target)
    try:
        tenant = new_tenant(pg_url)
        agent = tenant.tokens["agent"]
        assert caller.unary(caller.tools.PutToolContract, contract(), tenant.tokens["admin"])[2] == "OK"
        run_id = caller.unary(caller.runs.CreateRun, runs_pb2.CreateRunRequest(), agent)[0].run_id
        request_id = f"console-{uuid.uuid4().hex[:8]}"
        answer = caller.unary(caller.gate.AuthorizeEffect, authorize_request(run_id, "k-console"), agent, request_id)
        assert answer[2] == "OK" and answer[0].outcome == 1  # ALLOW

        def exported():
            values = [v for v in json_objects(server.log_path.read_text(errors="replace")) if isinstance(v, dict)]
            spans = [v for v in values if "context" in v and "name" in v]
            mine = [
                s
                for s in spans
                if s["name"] == f"/{AUTHORIZE}" and s["attributes"].get("effect_ledger.request_id") == request_id
            ]
            return mine and (mine, spans, values)

        (server_span,), spans, values = wait_for(exported, "the AuthorizeEffect span on standard output")
    finally:
        caller.close()
        server.stop()
    assert server_span["kind"] == "SpanKind.SERVER" and server_span["parent_id"] is None
    assert server_span["attributes"]["rpc.method"] == "AuthorizeEffect"
    assert server_span["resource"]["attributes"]["service.name"] == "effect-ledger"
    trace_id = server_span["context"]["trace_id"]
    by_id = {s["context"]["span_id"]: s for s in spans if s["context"]["trace_id"] == trace_id}

    def descends_from_server_span(span) -> bool:
        while span["parent_id"] is not None:
            if span["parent_id"] == server_span["context"]["span_id"]:
                return True
            span = by_id.get(span["parent_id"])
            if span is None:
                return False
        return False

    names = {s["name"] for s in by_id.values() if descends_from_server_span(s)}
    assert {"policy.evaluate", "db.transaction"} <= names, names
    # The access line names the same trace.
    (access,) = [v for v in values if v.get("logger") == "effect_ledger.access" and v.get("request_id") == request_id]
    assert "0x" + access["trace_id"] == trace_id
