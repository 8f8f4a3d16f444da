"""The MCP gateway end to end, on PostgreSQL and on SQLite, without a language model.

The gateway (effect_ledger_client.adapters.mcp_gateway) runs as a subprocess speaking MCP over
stdio to a ClientSession of the real `mcp` SDK, and fronts the example's mail server
(examples/mcp_gateway/mail_server.py), which appends every call that reaches it to a call log
and every email it sends to an outbox: those files count what reached the upstream. The ledger
is a real server; the effects are checked with GetEffect.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from effectledger.v1 import approvals_pb2, gate_pb2, tools_pb2
from support import REPO, contract, stage_name

EXAMPLE = REPO / "examples" / "mcp_gateway"
MODULE = "effect_ledger_client.adapters.mcp_gateway"
META = "effect-ledger/"
BOB = {"to": "bob@example.com", "subject": "Your ticket", "body": "It is fixed."}
SESSION_TIMEOUT_SECONDS = 60


class Files:
    """The upstream's call log and outbox, read back."""

    def __init__(self, folder: Path) -> None:
        self.calls_path = folder / "calls.jsonl"
        self.outbox_path = folder / "outbox.jsonl"

    def calls(self) -> list[dict]:
        return _lines(self.calls_path)

    def outbox(self) -> list[dict]:
        return _lines(self.outbox_path)


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def files(tmp_path) -> Files:
    return Files(tmp_path)


@pytest.fixture
def config_path(tmp_path, server, files) -> Path:
    """The example's gateway.toml, pointed at this test's server, run and files (as JSON)."""
    config = tomllib.loads((EXAMPLE / "gateway.toml").read_text())
    config["ledger"]["target"] = server.target
    config["run"] = {"request_id": f"mcp-gateway-{uuid.uuid4().hex}"}
    config["upstream"]["command"] = ["{python}", str(EXAMPLE / "mail_server.py")]
    config["upstream"]["env"] = {
        "MAIL_OUTBOX": str(files.outbox_path),
        "MAIL_CALL_LOG": str(files.calls_path),
    }
    # A tool whose contract nobody registered.
    config["tools"]["purge_outbox"] = {"ledger_tool": "outbox.purge"}
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps(config))
    return path


def gateway_environment(tenant) -> dict[str, str]:
    return {
        "EFFECT_LEDGER_TOKEN": tenant.tokens["agent"],
        "EFFECT_LEDGER_ADMIN_TOKEN": tenant.tokens["admin"],
    }


@pytest.fixture
def registered(config_path, tenant) -> None:
    """The example's contracts, registered through the gateway's own --register-contracts."""
    completed = subprocess.run(
        [sys.executable, "-m", MODULE, "--config", str(config_path), "--register-contracts"],
        env={**gateway_environment(tenant), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "registered email.send revision" in completed.stderr
    assert "registered newsletter.publish revision" in completed.stderr


@contextlib.asynccontextmanager
async def gateway(config_path: Path, tenant):
    """An MCP client session with the gateway subprocess, initialized."""
    log_path = config_path.parent / "gateway.log"
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", MODULE, "--config", str(config_path)],
        env=gateway_environment(tenant),
        cwd=str(config_path.parent),
    )
    with log_path.open("a") as errlog:
        try:
            async with (
                stdio_client(parameters, errlog=errlog) as (read, write),
                ClientSession(read, write, read_timeout_seconds=SESSION_TIMEOUT_SECONDS) as session,
            ):
                await session.initialize()
                yield session
        except BaseException:
            print(log_path.read_text()[-4000:], file=sys.stderr)
            raise


def text_of(result) -> str:
    return " ".join(block.text for block in result.content if block.type == "text")


def meta(result, name: str):
    return (result.meta or {}).get(META + name)


def effect(tenant, server, effect_id: str) -> gate_pb2.Effect:
    with tenant.client(server, "auditor") as auditor:
        return auditor.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))


async def test_an_allowed_call_reaches_the_upstream_once_and_a_repeat_answers_the_stored_result(
    config_path, registered, tenant, server, files
):
    async with gateway(config_path, tenant) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == {"send_email", "publish_newsletter", "list_outbox", "purge_outbox"}

        first = await session.call_tool("send_email", BOB)
        assert not first.is_error, text_of(first)
        assert text_of(first) == "queued message 1 to bob@example.com"
        assert meta(first, "outcome") == "SUCCEEDED"
        stored = effect(tenant, server, meta(first, "effect_id"))
        assert stage_name(stored.stage) == "SUCCEEDED"
        assert stored.tool == "email.send" and stored.target == "mailto:bob@example.com"
        detail = json.loads(stored.receipt.detail_json)
        assert detail["mcp_result"]["content"][0]["text"] == "queued message 1 to bob@example.com"
        # The upstream got the ledger's provider idempotency key in the request's _meta.
        [attempt] = stored.attempts
        assert files.outbox()[0]["key"] == attempt.provider_idempotency_key != ""

        again = await session.call_tool("send_email", BOB)
        assert not again.is_error, text_of(again)
        assert text_of(again) == "queued message 1 to bob@example.com"
        assert meta(again, "outcome") == "DUPLICATE"
        assert meta(again, "effect_id") == stored.effect_id

    # A restarted gateway finds the same run (request_id), so the same call is still a repeat.
    async with gateway(config_path, tenant) as session:
        restarted = await session.call_tool("send_email", BOB)
        assert meta(restarted, "outcome") == "DUPLICATE", text_of(restarted)
        # Same recipient and subject (the configured key), another body: another intent under
        # the same key, which the ledger refuses.
        reused = await session.call_tool("send_email", {**BOB, "body": "Something else."})
        assert reused.is_error
        assert "IDEMPOTENCY_KEY_REUSED" in text_of(reused)

    assert len(files.outbox()) == 1
    assert [call["tool"] for call in files.calls()] == ["send_email"]


async def test_tools_the_configuration_does_not_name_are_neither_listed_nor_forwarded(
    config_path, registered, tenant, files
):
    config = json.loads(config_path.read_text())
    del config["tools"]["purge_outbox"]
    config_path.write_text(json.dumps(config))
    async with gateway(config_path, tenant) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert listed == {"send_email", "publish_newsletter", "list_outbox"}
        refused = await session.call_tool("purge_outbox", {})
        assert refused.is_error
        assert meta(refused, "reason") == "TOOL_NOT_CONFIGURED"
        # An ungated tool is forwarded without asking the ledger.
        read = await session.call_tool("list_outbox", {})
        assert not read.is_error, text_of(read)
    assert [call["tool"] for call in files.calls()] == ["list_outbox"]


async def test_an_unregistered_or_retired_tool_is_refused_and_the_upstream_untouched(
    config_path, registered, tenant, server, files
):
    async with gateway(config_path, tenant) as session:
        unregistered = await session.call_tool("purge_outbox", {})
        assert unregistered.is_error
        assert meta(unregistered, "outcome") == "DENY"
        assert "TOOL_UNKNOWN" in text_of(unregistered)

        with tenant.client(server, "admin") as admin:
            admin.tools.RetireTool(tools_pb2.RetireToolRequest(tool="email.send", reason="mail is off"))
        retired = await session.call_tool("send_email", BOB)
        assert retired.is_error
        assert meta(retired, "outcome") == "DENY"
        assert "TOOL_RETIRED" in text_of(retired)
        assert [reason["code"] for reason in meta(retired, "reasons")] == ["TOOL_RETIRED"]
    assert files.calls() == []
    assert files.outbox() == []


async def test_an_irreversible_tool_waits_for_a_reviewer_then_runs_once(config_path, registered, tenant, server, files):
    issue = {"issue": "December", "body": "News."}
    async with gateway(config_path, tenant) as session:
        pending = await session.call_tool("publish_newsletter", issue)
        assert pending.is_error
        assert meta(pending, "outcome") == "REQUIRE_APPROVAL"
        approval_id = meta(pending, "approval_request_id")
        assert approval_id and approval_id in text_of(pending)
        assert "Retry" in text_of(pending)

        still_pending = await session.call_tool("publish_newsletter", issue)
        assert meta(still_pending, "approval_request_id") == approval_id
        assert files.calls() == []

        with tenant.client(server, "reviewer") as reviewer:
            reviewer.approvals.DecideApproval(
                approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=True, comment="ok")
            )
        published = await session.call_tool("publish_newsletter", issue)
        assert not published.is_error, text_of(published)
        assert meta(published, "outcome") == "SUCCEEDED"
        assert stage_name(effect(tenant, server, meta(published, "effect_id")).stage) == "SUCCEEDED"

        repeat = await session.call_tool("publish_newsletter", issue)
        assert meta(repeat, "outcome") == "DUPLICATE"
        assert text_of(repeat) == text_of(published)
    assert [call["tool"] for call in files.calls()] == ["publish_newsletter"]
    assert len(files.outbox()) == 3


async def test_an_upstream_error_of_a_tool_configured_failed_is_recorded_failed(
    config_path, registered, tenant, server, files
):
    assert json.loads(config_path.read_text())["tools"]["send_email"]["error_outcome"] == "failed"
    async with gateway(config_path, tenant) as session:
        bounced = await session.call_tool("send_email", {**BOB, "to": "nobody"})
        assert bounced.is_error
        assert "550 no such recipient" in text_of(bounced)
        assert meta(bounced, "outcome") == "FAILED"
        failed = effect(tenant, server, meta(bounced, "effect_id"))
        assert stage_name(failed.stage) == "FAILED"
        assert [stage_name(attempt.stage) for attempt in failed.attempts] == ["FAILED"]
    assert [call["arguments"]["to"] for call in files.calls()] == ["nobody"]
    assert files.outbox() == []


async def test_an_upstream_error_is_recorded_unknown_by_default(config_path, registered, tenant, server, files):
    """Without error_outcome an MCP tool error may have followed an effect: UNKNOWN, and the gate
    then asks for a reconciliation before the call runs again (no RETRY_SAME_KEY here)."""
    config = json.loads(config_path.read_text())
    del config["tools"]["send_email"]["error_outcome"]
    config["tools"]["send_email"]["ledger_tool"] = "email.strict"
    config_path.write_text(json.dumps(config))
    with tenant.client(server, "admin") as admin:
        admin.tools.PutToolContract(contract("email.strict"))
    async with gateway(config_path, tenant) as session:
        bounced = await session.call_tool("send_email", {**BOB, "to": "nobody"})
        assert bounced.is_error and "550 no such recipient" in text_of(bounced)
        assert meta(bounced, "outcome") == "UNKNOWN"
        uncertain = effect(tenant, server, meta(bounced, "effect_id"))
        assert stage_name(uncertain.stage) == "UNKNOWN"
        again = await session.call_tool("send_email", {**BOB, "to": "nobody"})
        assert meta(again, "outcome") == "RECONCILE_REQUIRED"
    assert [call["arguments"]["to"] for call in files.calls()] == ["nobody"]


SLOW_UPSTREAM = """
import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("slow")


@server.tool()
async def send_email(to: str, subject: str, body: str = "") -> str:
    with open(CALL_LOG, "a") as log:
        log.write("send_email\\n")
    await anyio.sleep(30)
    return "sent"


server.run("stdio")
"""


async def test_an_upstream_that_does_not_answer_leaves_the_effect_unknown_until_reconciled(
    config_path, tenant, server, tmp_path
):
    calls = tmp_path / "slow-calls.txt"
    script = tmp_path / "slow_server.py"
    script.write_text(f"CALL_LOG = {str(calls)!r}\n" + SLOW_UPSTREAM)
    config = json.loads(config_path.read_text())
    config["upstream"] = {"command": ["{python}", str(script)], "call_timeout_seconds": 1}
    config["tools"] = {"send_email": {"ledger_tool": "slow.send", "target": "mailto:{to}"}}
    config_path.write_text(json.dumps(config))
    with tenant.client(server, "admin") as admin:  # no RETRY_SAME_KEY: an UNKNOWN effect stops the gate
        admin.tools.PutToolContract(contract("slow.send"))

    async with gateway(config_path, tenant) as session:
        timed_out = await session.call_tool("send_email", BOB)
        assert timed_out.is_error
        assert meta(timed_out, "outcome") == "UNKNOWN"
        effect_id = meta(timed_out, "effect_id")
        assert effect_id in text_of(timed_out) and "reconciled" in text_of(timed_out)
        assert stage_name(effect(tenant, server, effect_id).stage) == "UNKNOWN"

        retried = await session.call_tool("send_email", BOB)
        assert retried.is_error
        assert meta(retried, "outcome") == "RECONCILE_REQUIRED"
        assert meta(retried, "effect_id") == effect_id and effect_id in text_of(retried)
    assert calls.read_text().splitlines() == ["send_email"]


# --- the pure parts: no server, no subprocess ---------------------------------------------------


def test_receipt_detail_keeps_a_result_that_fits_and_an_excerpt_of_one_that_does_not():
    import hashlib

    import mcp_types as types

    from effect_ledger_client.adapters import mcp_gateway

    small = types.CallToolResult(content=[types.TextContent(text="sent")], structured_content={"id": 7})
    detail = mcp_gateway.receipt_detail(small)
    assert detail["mcp_result"]["content"] == [{"type": "text", "text": "sent"}]
    assert detail["mcp_result"]["structuredContent"] == {"id": 7}

    for result in (
        types.CallToolResult(content=[types.TextContent(text='é"' * 40_000)]),  # over 64 KiB
        types.CallToolResult(content=[], structured_content={"id": 2**63 + 1}),  # no double holds it
        types.CallToolResult(content=[], structured_content=json.loads("[" * 40 + "]" * 40)),  # too deep
    ):
        excerpt = mcp_gateway.receipt_detail(result)
        assert excerpt["truncated"] is True
        whole = mcp_gateway.canonical_json(result.model_dump(mode="json", by_alias=True, exclude_none=True))
        assert excerpt["mcp_result_sha256"] == hashlib.sha256(whole.encode()).hexdigest()
        assert whole.startswith(excerpt["mcp_result_excerpt"])
        assert len(mcp_gateway.canonical_json(excerpt).encode()) <= 64 * 1024


def test_the_key_names_the_chosen_arguments_in_their_scope():
    from effect_ledger_client.adapters import mcp_gateway

    rule = mcp_gateway.ToolRule("send_email", ledger_tool="email.send", key_arguments=("to", "subject"))
    key = mcp_gateway.idempotency_key(rule, "run-1", BOB)
    assert key.startswith("mcp/email.send/") and len(key) <= 256 and key.isascii() and " " not in key
    assert key == mcp_gateway.idempotency_key(rule, "run-1", {**BOB, "body": "other"})
    assert key != mcp_gateway.idempotency_key(rule, "run-1", {**BOB, "to": "eve@example.com"})
    assert key != mcp_gateway.idempotency_key(rule, "run-2", BOB)
    tenant_wide = mcp_gateway.ToolRule("send_email", ledger_tool="email.send", key_scope="tenant")
    assert mcp_gateway.idempotency_key(tenant_wide, "run-1", BOB) == mcp_gateway.idempotency_key(
        tenant_wide, "run-2", BOB
    )
    with pytest.raises(mcp_gateway.Refusal) as refusal:
        mcp_gateway.idempotency_key(rule, "run-1", {"to": "bob@example.com"})
    assert refusal.value.reason == "KEY_ARGUMENT_MISSING"


def test_the_target_template_substitutes_plain_names_only():
    from effect_ledger_client.adapters import mcp_gateway

    assert mcp_gateway.render_target("mailto:{to}", BOB) == "mailto:bob@example.com"
    assert mcp_gateway.render_target("n:{n}", {"n": [1, 2]}) == "n:[1,2]"
    assert mcp_gateway.render_target("{to.__class__}", BOB) == "{to.__class__}"
    assert mcp_gateway.render_target("", BOB) is None
    with pytest.raises(mcp_gateway.Refusal):
        mcp_gateway.render_target("mailto:{cc}", BOB)


def test_a_configuration_error_names_the_field(tmp_path):
    from effect_ledger_client.adapters import mcp_gateway

    config = tomllib.loads((EXAMPLE / "gateway.toml").read_text())
    assert mcp_gateway.parse_config(config, tmp_path).tools["send_email"].key_arguments == (
        "to",
        "subject",
    )
    for edit, field in (
        (lambda c: c["run"].update(id="run-1"), "run"),
        (lambda c: c["tools"]["send_email"].update(key="to"), "tools.send_email.key"),
        (lambda c: c["tools"]["send_email"].update(keys=["to"]), "tools.send_email"),
        (lambda c: c["upstream"].update(command=[]), "upstream.command"),
        (lambda c: c["tools"].update({"bad name!": {}}), "tools.bad name!.ledger_tool"),
    ):
        broken = json.loads(json.dumps(config))
        edit(broken)
        with pytest.raises(mcp_gateway.ConfigError, match=f"^{field}"):
            mcp_gateway.parse_config(broken, tmp_path)
