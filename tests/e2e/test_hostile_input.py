"""What one tenant's admin (and agent) can send, over real gRPC, on PostgreSQL and on SQLite:
nothing of it stalls the server or escapes as INTERNAL/UNKNOWN; each refusal is
INVALID_ARGUMENT (or UNAVAILABLE for the policy) naming the field.

- arguments schemas: remote references refused at registration (no request reaches the URL),
  patterns run in linear time (RE2);
- archives: sparse, link and oversized members refused from their headers;
- enum numbers the proto does not define, in every request field that carries an enum;
- manifest fields of the wrong type, in archives of either readable format;
- control characters in identifiers and targets;
- a negative default estimate;
- a remote OPA fault: the client is told no host or URL.
"""

from __future__ import annotations

import importlib
import io
import json
import pkgutil
import tarfile
import time
import uuid

import pytest
from opa_standin import OpaStandIn
from unit.test_schema_safety import PATHOLOGICAL, PATHOLOGICAL_INPUT, CountingServer, gnu_sparse

import effectledger.v1
from e2e.test_checkpoint_archives import _consistent, import_archive, seal_and_export, tar_files
from effect_ledger.domain.checkpoints import (
    ARCHIVE_FILE_SIZE_MAX_BYTES,
    ARCHIVE_UNPACKED_SIZE_MAX_BYTES,
)
from effect_ledger.errors import LedgerError
from effect_ledger.policy.engine import default_policy_dir
from effectledger.v1 import (
    approvals_pb2,
    budgets_pb2,
    checkpoints_pb2,
    common_pb2,
    gate_pb2,
    retention_pb2,
    runs_pb2,
    schedules_pb2,
    tools_pb2,
)
from support import (
    ServerProcess,
    authorize_request,
    checkpoints_stub,
    contract,
    new_run,
    new_tenant,
    raises_error,
)

UNDEFINED = 99


def violation_fields() -> list[str]:
    return [v.field for v in raises_error.last.violations]


# --- arguments schemas -----------------------------------------------------------------------


def test_a_schema_with_a_remote_ref_is_refused_at_registration(admin):
    with CountingServer() as remote:
        for schema in (
            {"type": "object", "properties": {"to": {"$ref": remote.url}}},
            {"$id": remote.url, "$ref": "#/$defs/a", "$defs": {"a": {"type": "object"}}},
            {"$dynamicRef": "#meta"},
            {"$schema": "http://json-schema.org/draft-07/schema#"},
        ):
            with raises_error("INVALID_ARGUMENT", "INVALID_TOOL_CONTRACT"):
                admin.tools.PutToolContract(contract(arguments_schema_json=json.dumps(schema).encode()))
            assert violation_fields() == ["contract.arguments_schema_json"], schema
        assert remote.requests == 0
    with raises_error("NOT_FOUND"):  # nothing was registered
        admin.tools.GetToolContract(tools_pb2.GetToolContractRequest(tool="email.send"))


def test_a_pattern_re2_cannot_run_is_refused_at_registration(admin):
    schema = {"type": "object", "properties": {"to": {"type": "string", "pattern": "(a)\\1"}}}
    with raises_error("INVALID_ARGUMENT", "INVALID_TOOL_CONTRACT"):
        admin.tools.PutToolContract(contract(arguments_schema_json=json.dumps(schema).encode()))
    assert violation_fields() == ["contract.arguments_schema_json"]
    assert "/properties/to/pattern" in raises_error.last.violations[0].description


def test_a_pathological_pattern_answers_at_once(admin, agent):
    schema = {"type": "object", "properties": {"to": {"type": "string", "pattern": PATHOLOGICAL}}}
    admin.tools.PutToolContract(contract(arguments_schema_json=json.dumps(schema).encode()))
    run_id = new_run(agent)
    arguments = json.dumps({"to": PATHOLOGICAL_INPUT}).encode()
    # Compiled on the first call (which may also start the checks' worker process), from the
    # cache on the second. A backtracking engine takes seconds on this input (about 10 s for
    # Python's re here), every time; the bounds leave room for a loaded machine.
    for attempt, bound_seconds in enumerate((2.0, 1.0)):
        started = time.monotonic()
        with raises_error("INVALID_ARGUMENT", "ARGUMENTS_SCHEMA_VIOLATION"):
            agent.gate.AuthorizeEffect(authorize_request(run_id, f"k-{attempt}", arguments=arguments))
        assert time.monotonic() - started < bound_seconds, f"call {attempt}"
        assert violation_fields() == ["arguments_json['to']"]
    matching = json.dumps({"to": "a" * 30}).encode()
    assert agent.gate.AuthorizeEffect(authorize_request(run_id, "k-ok", arguments=matching)).outcome == common_pb2.ALLOW


def test_a_costly_argument_check_does_not_stall_other_calls(server, admin, agent):
    """Four AuthorizeEffect calls whose arguments make the schema check spend its whole step
    budget (two branches at each of 30 levels), while a health check is timed every 10 ms: the
    checks run in worker processes (service/argument_checks.py), so the event loop keeps
    answering. Measured on a 2-core machine: the slowest health check 9-13 ms while the checks
    ran; on the event loop each check held every call for 0.3-0.4 s, and on threads of the
    server's own process the slowest health check waited 333 ms."""
    import threading

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    branch = {"type": "array", "items": {"$ref": "#/$defs/nested"}}
    schema = {
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/nested"}},
        "$defs": {"nested": {"anyOf": [branch, branch]}},
    }
    admin.tools.PutToolContract(contract(arguments_schema_json=json.dumps(schema).encode()))
    run_id = new_run(agent)
    nested: object = 1
    for _ in range(30):
        nested = [nested]
    arguments = json.dumps({"x": nested}).encode()
    latencies: list[float] = []
    answered: list[str] = []
    stop = threading.Event()

    def probe() -> None:
        with grpc.insecure_channel(server.target) as channel:
            checker = health_pb2_grpc.HealthStub(channel)
            checker.Check(health_pb2.HealthCheckRequest(), timeout=5)
            while not stop.is_set():
                started = time.monotonic()
                checker.Check(health_pb2.HealthCheckRequest(), timeout=5)
                latencies.append(time.monotonic() - started)
                time.sleep(0.01)

    def costly(index: int) -> None:
        try:
            agent.gate.AuthorizeEffect(authorize_request(run_id, f"costly-{index}", arguments=arguments))
            answered.append("ALLOW")
        except LedgerError as error:
            answered.append(error.reason)

    prober = threading.Thread(target=probe)
    prober.start()
    time.sleep(0.2)
    started = time.monotonic()
    callers = [threading.Thread(target=costly, args=(index,)) for index in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(30)
    busy = time.monotonic() - started
    stop.set()
    prober.join(10)
    print(f"costly checks took {busy:.2f} s; health checks: {len(latencies)}, slowest {max(latencies) * 1000:.1f} ms")
    assert answered == ["ARGUMENTS_CHECK_TOO_COSTLY"] * 4
    assert busy > 0.1, "the checks were not costly: the test measures nothing"
    # On the event loop each check held every call for 300-400 ms; 200 ms leaves room for a
    # loaded machine (the test command runs two test processes at once).
    assert max(latencies) < 0.2, f"a health check waited {max(latencies) * 1000:.0f} ms"


# --- archives --------------------------------------------------------------------------------


def _member(name: str, kind: bytes = tarfile.REGTYPE, content: bytes = b"", linkname: str = ""):
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mode = kind, len(content), linkname, 0o644
    return info, (content if kind == tarfile.REGTYPE else None)


def _tar(*entries) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, content in entries:
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    return buffer.getvalue()


OVERSIZED_MEMBER_BYTES = ARCHIVE_FILE_SIZE_MAX_BYTES - 1024
OVERSIZED_COUNT = ARCHIVE_UNPACKED_SIZE_MAX_BYTES // OVERSIZED_MEMBER_BYTES


def _oversized_total() -> bytes:
    """Members under the per-file limit, then one more header that takes the sum of the sizes
    the headers state past the unpacked limit (the archive itself stays under its own limit)."""
    blocks = []
    for n in range(OVERSIZED_COUNT + 1):
        info = tarfile.TarInfo(f"part{n}.bin")
        info.size = OVERSIZED_MEMBER_BYTES
        blocks.append(info.tobuf(tarfile.USTAR_FORMAT))
        if n < OVERSIZED_COUNT:
            blocks.append(b"\0" * OVERSIZED_MEMBER_BYTES)  # a multiple of 512: no padding
    return b"".join(blocks)


ARCHIVES = {
    # 61 KB that unpack to 480 MiB.
    "sparse": (
        b"".join(gnu_sparse(f"holes/{n:02}.bin", 8 * 1024 * 1024 - 512) for n in range(60)) + b"\0" * 1024,
        "holes/00.bin",
    ),
    "symlink": (
        _tar(
            _member("manifest.json", content=b"{}"),
            _member("state.json", tarfile.SYMTYPE, linkname="/etc/passwd"),
        ),
        "state.json",
    ),
    "hardlink": (
        _tar(_member("ledger.json", tarfile.LNKTYPE, linkname="/etc/shadow")),
        "ledger.json",
    ),
    "fifo": (_tar(_member("pipe", tarfile.FIFOTYPE)), "pipe"),
}


@pytest.mark.parametrize("case", list(ARCHIVES))
def test_an_inflating_or_linking_archive_is_refused_from_its_headers(server, tenant, case):
    data, member = ARCHIVES[case]
    stub = checkpoints_stub(server, tenant.tokens["admin"])
    with raises_error("INVALID_ARGUMENT", "ARCHIVE_INVALID"):
        import_archive(stub, data, allow_unsigned=True)
    assert violation_fields() == [member]
    assert raises_error.last.metadata["component"] == member


def test_an_archive_whose_members_add_up_past_the_limit_is_refused(server, tenant):
    data = _oversized_total()
    assert len(data) < 32 * 1024 * 1024
    stub = checkpoints_stub(server, tenant.tokens["admin"])
    with raises_error("INVALID_ARGUMENT", "ARCHIVE_INVALID"):
        import_archive(stub, data, allow_unsigned=True)
    assert violation_fields() == [f"part{OVERSIZED_COUNT}.bin"]
    assert "unpacked" in raises_error.last.message


# --- manifest fields -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(server, database_url):
    return seal_and_export(server, new_tenant(database_url))


@pytest.mark.parametrize("format_version", [1, 2])
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("revision", "abc"),
        ("revision", -3),
        ("checkpoint_id", 12),
        ("sections", ["x"]),
        ("artifacts", {"a": 1}),
        ("sealed_at", None),
    ],
)
def test_a_manifest_field_of_the_wrong_type_is_invalid(exported, format_version, field, value):
    """Into a new run (so nothing but the field can refuse it), by an admin who imports unsigned
    archives on purpose, with everything derivable made consistent."""

    def change(manifest):
        manifest["format_version"] = format_version
        manifest["run_id"] = f"run_{uuid.uuid4().hex[:12]}"
        manifest[field] = value

    data = tar_files(_consistent(exported.files, change))
    with raises_error("INVALID_ARGUMENT", "ARCHIVE_INVALID"):
        import_archive(exported.admin_stub, data, allow_unsigned=True)
    assert violation_fields() == [f"manifest.json: {field}"]


# --- enum numbers the proto does not define --------------------------------------------------

# Every enum field of every request message, found from the descriptors; each is sent below.
ENUM_FIELDS = {
    ("ToolRegistry", "PutToolContract", "contract.effect_class"),
    ("ToolRegistry", "PutToolContract", "contract.allowed_recovery"),
    ("Approvals", "ListApprovals", "state"),
    ("Budgets", "PutBudget", "scope"),
    ("Budgets", "GetBudget", "scope"),
    ("Budgets", "ListBudgets", "scope"),
    ("Gate", "RecordOutcome", "failed.evidence"),
    ("Checkpoints", "SealCheckpoint", "artifacts.classification"),
    ("Checkpoints", "ForkRun", "world"),
    ("Gate", "ListEffects", "stages"),
    ("Gate", "ListDecisions", "outcome"),
    ("Retention", "PutRetentionRule", "kind"),
    ("Schedules", "ScheduleIntent", "purpose"),
    ("Schedules", "ScheduleIntent", "cancel_conditions"),
    ("Schedules", "ListSchedules", "state"),
}


def _enum_paths(message, prefix: str, seen: frozenset[str]):
    for field in message.fields:
        if field.enum_type is not None:
            yield prefix + field.name
        elif field.message_type is not None:
            name = field.message_type.full_name
            if name not in seen and not name.startswith("google."):
                yield from _enum_paths(field.message_type, f"{prefix}{field.name}.", seen | {name})


def test_the_enum_fields_below_are_every_enum_field_of_every_request():
    found = set()
    for module in pkgutil.iter_modules(effectledger.v1.__path__):
        if module.name.endswith("_pb2"):
            descriptor = importlib.import_module(f"effectledger.v1.{module.name}").DESCRIPTOR
            for service in descriptor.services_by_name.values():
                for method in service.methods:
                    for path in _enum_paths(method.input_type, "", frozenset({method.input_type.full_name})):
                        found.add((service.name, method.name, path))
    assert found == ENUM_FIELDS


def test_an_undefined_enum_number_is_invalid_argument_in_every_request(server, tenant, admin, agent):
    stub = checkpoints_stub(server, tenant.tokens["agent"])
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    allowed = agent.gate.AuthorizeEffect(authorize_request(run_id, "enum-1"))
    calls = {
        "contract.effect_class": lambda: admin.tools.PutToolContract(contract("t.enum", effect_class=UNDEFINED)),
        "contract.allowed_recovery[0]": lambda: admin.tools.PutToolContract(
            contract("t.enum", allowed_recovery=(UNDEFINED,))
        ),
        "state": lambda: agent.approvals.ListApprovals(approvals_pb2.ListApprovalsRequest(state=UNDEFINED)),
        "scope": lambda: admin.budgets.PutBudget(
            budgets_pb2.PutBudgetRequest(scope=UNDEFINED, dimension="usd_micros", limit=1)
        ),
        "scope (get)": lambda: agent.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=UNDEFINED)),
        "scope (list)": lambda: agent.budgets.ListBudgets(budgets_pb2.ListBudgetsRequest(scope=UNDEFINED)),
        "failed.evidence": lambda: agent.gate.RecordOutcome(
            gate_pb2.RecordOutcomeRequest(
                attempt_id=allowed.attempt_id,
                failed=gate_pb2.RecordOutcomeRequest.Failed(reason="x", evidence=UNDEFINED),
            )
        ),
        "artifacts[0].classification": lambda: stub.SealCheckpoint(
            checkpoints_pb2.SealCheckpointRequest(
                run_id=run_id,
                state_json=b"{}",
                artifacts=[
                    checkpoints_pb2.ArtifactRef(name="a", digest="sha256:" + "0" * 64, classification=UNDEFINED)
                ],
            )
        ),
        "stages[0]": lambda: agent.gate.ListEffects(gate_pb2.ListEffectsRequest(stages=[UNDEFINED])),
        "outcome": lambda: agent.gate.ListDecisions(gate_pb2.ListDecisionsRequest(outcome=UNDEFINED)),
        "world": lambda: stub.ForkRun(
            checkpoints_pb2.ForkRunRequest(checkpoint_id="chk_x", world=UNDEFINED, difference="what if")
        ),
        "purpose": lambda: agent.schedules.ScheduleIntent(
            schedules_pb2.ScheduleIntentRequest(run_id=run_id, purpose=UNDEFINED, delay_seconds=5)
        ),
        "cancel_conditions[0]": lambda: agent.schedules.ScheduleIntent(
            schedules_pb2.ScheduleIntentRequest(
                run_id=run_id, purpose=schedules_pb2.DELAYED_RETRY, cancel_conditions=[UNDEFINED], delay_seconds=5
            )
        ),
        "state (schedules)": lambda: agent.schedules.ListSchedules(schedules_pb2.ListSchedulesRequest(state=UNDEFINED)),
        "kind": lambda: admin.retention.PutRetentionRule(
            retention_pb2.PutRetentionRuleRequest(kind=UNDEFINED, max_age_seconds=3600)
        ),
    }
    for field, call in calls.items():
        with raises_error("INVALID_ARGUMENT", "INVALID_ENUM"):
            call()
        assert violation_fields() == [field.split(" ")[0]], field


# --- control characters ----------------------------------------------------------------------

CONTROL = ["\n", "\x00", "\x1b[31m", "\r", "\u2028", "\u202e"]


@pytest.mark.parametrize("character", CONTROL, ids=[repr(c) for c in CONTROL])
def test_control_characters_in_identifiers_and_targets_are_refused(admin, agent, character):
    admin.tools.PutToolContract(contract())
    run_id = new_run(agent)
    cases = {
        "target": authorize_request(run_id, "k-target", target=f"mailto:bob@example.com{character}"),
        "run_id": authorize_request(run_id + character, "k-run"),
        "idempotency_key": authorize_request(run_id, f"k-key{character}"),
        "tool": authorize_request(run_id, "k-tool", tool=f"email.send{character}"),
    }
    for field, request in cases.items():
        with raises_error("INVALID_ARGUMENT"):
            agent.gate.AuthorizeEffect(request)
        assert violation_fields() == [field], (field, raises_error.last.message)
    with raises_error("INVALID_ARGUMENT"):
        agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=f"att_1{character}"))
    assert violation_fields() == ["attempt_id"]
    with raises_error("INVALID_ARGUMENT"):
        agent.approvals.RequestApproval(
            approvals_pb2.RequestApprovalRequest(
                run_id=run_id,
                tool="email.send",
                arguments_json=b"{}",
                target=f"bank:{character}acct",
            )
        )
    assert violation_fields() == ["target"]
    with raises_error("INVALID_ARGUMENT"):
        agent.runs.CreateRun(runs_pb2.CreateRunRequest(labels={"team": f"ops{character}"}))
    assert violation_fields() == ["labels['team']"]
    # Nothing was written for any of them.
    assert list(agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=run_id)).effects) == []


# --- default estimates -----------------------------------------------------------------------


def test_a_negative_default_estimate_is_refused_naming_the_dimension(admin):
    request = contract("t.estimate")
    request.contract.default_estimate["usd_micros"] = -5
    with raises_error("INVALID_ARGUMENT", "INVALID_TOOL_CONTRACT"):
        admin.tools.PutToolContract(request)
    assert violation_fields() == ["contract.default_estimate.usd_micros"]


# --- remote OPA faults -----------------------------------------------------------------------


@pytest.mark.postgres
def test_a_remote_opa_fault_tells_the_client_no_host(pg_url):
    with OpaStandIn(default_policy_dir(), slow_seconds=2.0) as standin:
        opa_server = ServerProcess(pg_url, ["--opa-url", standin.url, "--opa-timeout-seconds", "0.5"]).start()
        try:
            tenant = new_tenant(pg_url)
            admin, agent = tenant.client(opa_server, "admin"), tenant.client(opa_server, "agent")
            admin.tools.PutToolContract(contract())
            run_id = new_run(agent)
            host, port = standin.url.split("//", 1)[1].rstrip("/").split(":")[:2]
            for mode in ("http500", "stopped"):
                standin.set_mode(mode)
                with pytest.raises(LedgerError) as caught:
                    agent.gate.AuthorizeEffect(authorize_request(run_id, f"opa-{mode}"))
                error = caught.value
                assert error.reason == "POLICY_UNAVAILABLE", (mode, error)
                told = error.message + json.dumps(error.metadata)
                for leak in (host, port, "http://", standin.url):
                    assert leak not in told, (mode, told)
            assert port in opa_server.log()  # the detail is in the server's log
        finally:
            opa_server.stop()
