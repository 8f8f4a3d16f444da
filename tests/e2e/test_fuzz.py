"""A fuzzing client: random and mutated requests to every RPC of every service, with and
without valid tokens, against a real server on each backend.

What must hold, for every request: the answer is a status the client can act on, never
INTERNAL or UNKNOWN, and its message carries no exception text. After all of them: no stack
trace in the server's log, the server still answers SERVING, and its memory stayed bounded.

The requests are drawn by hypothesis from the services' own descriptors (every field of every
request type: ids from the tenant's real ids or made up, text with control characters,
malformed and oversized JSON, unknown enum numbers, out-of-range numbers and timestamps),
and from valid requests with some fields replaced. The seed is in pytest's report header
(``tests/conftest.py``; output captured under pytest-xdist would hide a print) and in every
failure message. By default it is taken from the checked-out commit (``support.fuzz_seed``), so
a commit's CI run replays what ran locally: ``EFFECT_LEDGER_FUZZ_SEED=<seed>`` replays a run,
any other number explores new requests; ``EFFECT_LEDGER_FUZZ_REQUESTS`` sets how many requests
each backend gets (5,000 on PostgreSQL and 2,000 on SQLite by default), spread over every RPC
of every service the generated package declares.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import effectledger.v1
from effectledger.v1 import (
    approvals_pb2,
    budgets_pb2,
    checkpoints_pb2,
    common_pb2,
    gate_pb2,
    principals_pb2,
    retention_pb2,
    runs_pb2,
    schedules_pb2,
    tools_pb2,
)
from support import ServerProcess, contract, fuzz_seed, new_run, new_tenant, rss_kib

FILES = (
    gate_pb2,
    runs_pb2,
    tools_pb2,
    approvals_pb2,
    budgets_pb2,
    checkpoints_pb2,
    principals_pb2,
    schedules_pb2,
    retention_pb2,
)


SEED = fuzz_seed()
REQUESTS = {"postgres": 5000, "sqlite": 2000}
FORBIDDEN_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
# What an exception's text looks like when it leaks into a status message.
LEAK = re.compile(r"Traceback|Error\(|Exception\b|KeyError|ValueError|TypeError|AttributeError|File \"")
RSS_GROWTH_MAX_MIB = 150
DEPTH_MAX = 3


def methods() -> list[tuple[str, object, bool, bool]]:
    """(path, request class, client streaming, server streaming) for every RPC."""
    found = []
    for module in FILES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                request_class = message_factory.GetMessageClass(method.input_type)
                path = f"/{service.full_name}/{method.name}"
                found.append((path, request_class, method.client_streaming, method.server_streaming))
    return sorted(found, key=lambda item: item[0])


def declared_services() -> set[str]:
    """Every service the generated package declares (a new proto file's included)."""
    found = set()
    for module_info in pkgutil.iter_modules(effectledger.v1.__path__):
        if module_info.name.endswith("_pb2"):
            module = importlib.import_module(f"effectledger.v1.{module_info.name}")
            found.update(service.full_name for service in module.DESCRIPTOR.services_by_name.values())
    return found


METHODS = methods()
DECLARED_SERVICES = declared_services()
FUZZED_SERVICES = {path.split("/")[1] for path, *_ in METHODS}
assert DECLARED_SERVICES == FUZZED_SERVICES, f"services not fuzzed: {DECLARED_SERVICES - FUZZED_SERVICES}"
# Approvals 6, Budgets 4, Checkpoints 17, Gate 12, Principals 5, Retention 6, Runs 4,
# Schedules 5, ToolRegistry 4.
assert len(METHODS) == 63, f"{len(METHODS)} RPCs: update the count (and the valid requests) when one is added"

INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def strings(pool: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(pool),
        st.just(""),
        st.text(max_size=40),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=12).map(lambda t: t + "\x00\n\x1b[31m"),
        st.sampled_from(["email.send", "wire.send", "mailto:a@example.com", "../../etc/passwd", "a" * 5000]),
        st.sampled_from(pool).map(lambda t: t + "\u202e"),
    )


binaries = st.one_of(
    st.just(b""),
    st.just(b"{}"),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.sampled_from([b"\xff\xfe", b"[" * 2000 + b"]" * 2000, b'{"a":' * 600 + b"1" + b"}" * 600, b"x" * 200_000]),
)


def field_values(field: FieldDescriptor, pool: list[str], depth: int) -> st.SearchStrategy:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return strings(pool)
    if kind == FieldDescriptor.TYPE_BYTES:
        return binaries
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_ENUM:
        numbers = [value.number for value in field.enum_type.values]
        return st.one_of(st.sampled_from(numbers), st.integers(-3, 120))
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(width=32 if kind == FieldDescriptor.TYPE_FLOAT else 64)
    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        edges = [value for value in (0, 1, -1, 60, 2**31 - 1, 2**53, low, high) if low <= value <= high]
        return st.one_of(st.sampled_from(edges), st.integers(low, high))
    if kind == FieldDescriptor.TYPE_MESSAGE:
        if depth >= DEPTH_MAX:
            return st.none()
        return message_values(field.message_type, pool, depth + 1)
    raise AssertionError(f"no strategy for field type {kind}")


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def message_values(descriptor, pool: list[str], depth: int = 0) -> st.SearchStrategy:
    """A dict of field name -> value (a strategy per field, each field optional)."""
    optional = {}
    for field in descriptor.fields:
        if _is_map(field):
            key_field, value_field = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            optional[field.name] = st.dictionaries(
                field_values(key_field, pool, depth), field_values(value_field, pool, depth), max_size=3
            )
        elif field.is_repeated:
            optional[field.name] = st.lists(field_values(field, pool, depth), max_size=3)
        else:
            optional[field.name] = field_values(field, pool, depth)
    return st.fixed_dictionaries({}, optional=optional)


def fill(message, values: dict) -> None:
    """Set ``values`` on ``message``: a value the message type rejects is skipped, as a client's
    own protobuf library would refuse to send it."""
    for name, value in values.items():
        if value is None:
            continue
        field = message.DESCRIPTOR.fields_by_name[name]
        try:
            if _is_map(field):
                target = getattr(message, name)
                for key, item in value.items():
                    if isinstance(item, dict):
                        fill(target[key], item)
                    else:
                        target[key] = item
            elif field.is_repeated:
                target = getattr(message, name)
                for item in value:
                    if isinstance(item, dict):
                        fill(target.add(), item)
                    elif item is not None:
                        target.append(item)
            elif isinstance(value, dict):
                fill(getattr(message, name), value)
                getattr(message, name).SetInParent()
            else:
                setattr(message, name, value)
        except (ValueError, TypeError, OverflowError):
            continue


class Ledger:
    """A server of its own on the backend's database, and a tenant with some of everything."""

    def __init__(self, database_url: str) -> None:
        self.server = ServerProcess(database_url, ["--lease-sweep-interval-seconds", "0.2"]).start()
        self.tenant = new_tenant(database_url)
        self.tenant.add("operator", "operator")
        self.pool = ["", "x"]
        self.valid: dict[str, list] = {}
        with self.tenant.client(self.server, "admin") as admin, self.tenant.client(self.server, "agent") as agent:
            admin.tools.PutToolContract(contract())
            admin.tools.PutToolContract(
                contract("wire.send", effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False, max_attempts=1)
            )
            run_id = new_run(agent)
            authorize = gate_pb2.AuthorizeEffectRequest(
                run_id=run_id, tool="email.send", arguments_json=b'{"to":"a"}', idempotency_key="k1", target="mailto:a"
            )
            allowed = agent.gate.AuthorizeEffect(authorize)
            approval = agent.approvals.RequestApproval(
                approvals_pb2.RequestApprovalRequest(
                    run_id=run_id, tool="wire.send", arguments_json=b"{}", target="acct:1"
                )
            )
            schedule = schedules_pb2.ScheduleIntentRequest(
                run_id=run_id,
                tool="email.send",
                arguments_json=b'{"to":"b"}',
                idempotency_key="k2",
                target="mailto:b",
                purpose=schedules_pb2.DELAYED_RETRY,
                delay_seconds=3600,
                cancel_conditions=[schedules_pb2.CANCEL_WHEN_EFFECT_SUCCEEDED],
            )
            scheduled = agent.schedules.ScheduleIntent(schedule)
            hold = retention_pb2.PlaceLegalHoldRequest(run_id=run_id, reason="case 1")
            admin.retention.PlaceLegalHold(hold)
            self.pool += [run_id, allowed.effect_id, allowed.attempt_id, allowed.decision_id, approval.approval_id]
            self.pool += [scheduled.schedule_id, "email.send", "wire.send", "agent", "admin", "reviewer", "k1", "k2"]
            self.pool += ["usd_micros"]
            self.valid = {
                "/effectledger.v1.Gate/AuthorizeEffect": [authorize],
                "/effectledger.v1.Gate/RecordDispatch": [gate_pb2.RecordDispatchRequest(attempt_id=allowed.attempt_id)],
                "/effectledger.v1.Runs/CreateRun": [runs_pb2.CreateRunRequest(labels={"a": "b"})],
                "/effectledger.v1.ToolRegistry/PutToolContract": [contract("fuzz.tool")],
                "/effectledger.v1.Checkpoints/SealCheckpoint": [
                    checkpoints_pb2.SealCheckpointRequest(run_id=run_id, state_json=b"{}")
                ],
                "/effectledger.v1.Approvals/RequestApproval": [
                    approvals_pb2.RequestApprovalRequest(
                        run_id=run_id, tool="wire.send", arguments_json=b"{}", target="t"
                    )
                ],
                "/effectledger.v1.Budgets/PutBudget": [
                    budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension="usd_micros", limit=100)
                ],
                "/effectledger.v1.Schedules/ScheduleIntent": [schedule],
                "/effectledger.v1.Schedules/CancelSchedule": [
                    schedules_pb2.CancelScheduleRequest(schedule_id=scheduled.schedule_id, reason="done")
                ],
                "/effectledger.v1.Schedules/WatchDueIntents": [schedules_pb2.WatchDueIntentsRequest(run_id=run_id)],
                "/effectledger.v1.Retention/PutRetentionRule": [
                    retention_pb2.PutRetentionRuleRequest(kind=retention_pb2.TRACE, max_age_seconds=86_400)
                ],
                "/effectledger.v1.Retention/PlaceLegalHold": [hold],
                "/effectledger.v1.Retention/CollectRetention": [retention_pb2.CollectRetentionRequest(dry_run=True)],
            }
        self.tokens = [None, "forged-token", *self.tenant.tokens.values()]
        self.channel = grpc.insecure_channel(self.server.target)

    def close(self) -> None:
        self.channel.close()
        self.server.stop()


@pytest.fixture(scope="module")
def ledger(database_url):
    made = Ledger(database_url)
    yield made
    made.close()


def call(ledger: Ledger, path: str, request_class, client_streaming: bool, server_streaming: bool, messages, token):
    """One RPC: its status code and message (OK when it answered)."""
    serialize, deserialize = (lambda m: m.SerializeToString()), (lambda b: b)
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    try:
        if client_streaming:
            ledger.channel.stream_unary(path, serialize, deserialize)(iter(messages), metadata=metadata, timeout=5)
        elif server_streaming:
            responses = ledger.channel.unary_stream(path, serialize, deserialize)(
                messages[0], metadata=metadata, timeout=1
            )
            for index, _ in enumerate(responses):
                if index >= 2:
                    responses.cancel()
                    break
        else:
            ledger.channel.unary_unary(path, serialize, deserialize)(messages[0], metadata=metadata, timeout=5)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def test_random_requests_to_every_rpc_never_break_the_server(ledger, backend):
    count = int(os.environ.get("EFFECT_LEDGER_FUZZ_REQUESTS") or REQUESTS[backend])
    print(f"\nfuzz seed {SEED} ({count} requests on {backend}): EFFECT_LEDGER_FUZZ_SEED={SEED} replays it")
    before = rss_kib(ledger.server.process.pid)
    seen: dict[str, int] = {}
    # Every strategy is built once, here, not on every draw: building (and validating) the nested
    # strategies anew for each request cost about a third of the test's time. The strategies,
    # and so the requests a seed draws, are the same.
    field_strategies: dict[str, st.SearchStrategy] = {}
    method_values = st.sampled_from(METHODS)
    valid_values = {path: st.sampled_from(valid) for path, valid in ledger.valid.items() if valid}
    token_values = st.sampled_from(ledger.tokens)

    def fields_of(request_class) -> st.SearchStrategy:
        name = request_class.DESCRIPTOR.full_name
        if name not in field_strategies:
            field_strategies[name] = message_values(request_class.DESCRIPTOR, ledger.pool)
        return field_strategies[name]

    @st.composite
    def requests(draw):
        path, request_class, client_streaming, server_streaming = draw(method_values)
        count_messages = draw(st.integers(0, 3)) if client_streaming else 1
        messages = []
        for _ in range(count_messages):
            message = request_class()
            valid = ledger.valid.get(path)
            if valid and draw(st.booleans()):
                message.CopyFrom(draw(valid_values[path]))  # a valid request, some fields replaced
            fill(message, draw(fields_of(request_class)))
            messages.append(message)
        token = draw(token_values)
        return path, request_class, client_streaming, server_streaming, messages, token

    @seed(SEED)
    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(requests())
    def one(drawn):
        path, request_class, client_streaming, server_streaming, messages, token = drawn
        code, details = call(ledger, path, request_class, client_streaming, server_streaming, messages, token)
        seen[code.name] = seen.get(code.name, 0) + 1
        assert code not in FORBIDDEN_CODES, f"{path} answered {code.name}: {details} (seed {SEED})"
        assert not LEAK.search(details), f"{path} leaked exception text: {details!r} (seed {SEED})"

    one()
    print(f"status codes: {dict(sorted(seen.items()))}")
    assert sum(seen.values()) >= count
    assert ledger.server.health() == health_pb2.HealthCheckResponse.SERVING
    grown_mib = (rss_kib(ledger.server.process.pid) - before) / 1024
    assert grown_mib < RSS_GROWTH_MAX_MIB, f"the server grew by {grown_mib:.0f} MiB (seed {SEED})"
    log = ledger.server.log()
    assert "Traceback" not in log, f"a stack trace in the server's log (seed {SEED}):\n{log[-4000:]}"
