"""The runnable examples in examples/ run as their docstrings say, each a subprocess against a
real server with the tokens in its environment: the LangGraph and the OpenAI Agents SDK scripts,
and the MCP gateway's call_tool.py (with gateway.toml pointed at the test's server and files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

from support import REPO

EXAMPLES = REPO / "examples"
MCP_EXAMPLE = EXAMPLES / "mcp_gateway"
RUN_TIMEOUT_SECONDS = 120

# The session's SQLite server only: the examples exercise the adapters, not the backends.
pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def run_example(arguments: list[str], environment: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    completed = subprocess.run(
        [sys.executable, *arguments],
        env={**os.environ, **environment},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
        check=False,
    )
    return completed


def tokens(server, tenant) -> dict[str, str]:
    return {
        "EFFECT_LEDGER_TARGET": server.target,
        "EFFECT_LEDGER_ADMIN_TOKEN": tenant.tokens["admin"],
        "EFFECT_LEDGER_AGENT_TOKEN": tenant.tokens["agent"],
        "EFFECT_LEDGER_REVIEWER_TOKEN": tenant.tokens["reviewer"],
    }


def test_the_langgraph_example(server, tenant):
    completed = run_example([str(EXAMPLES / "langgraph_guarded_tool.py")], tokens(server, tenant))
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    # The email is sent once, and the repeat answers the same output without sending.
    assert out.count("(sending 'hi' to bob@example.com)") == 1, out
    assert out.count("-> queued 'hi' for bob@example.com") == 2, out
    # The wire waits for an approval, then runs once after the reviewer's decision.
    assert "-> interrupted: apr_" in out and " PENDING" in out and out.count("(wiring 100 to acct-1)") == 1, out
    assert "-> wired 100 to acct-1" in out
    # A tool without a contract is denied and does not run.
    assert "-> error effect-ledger: email.unregistered was denied (TOOL_UNKNOWN" in out, out
    assert "eve@example.com" not in out


def test_the_openai_agents_example(server, tenant):
    completed = run_example([str(EXAMPLES / "openai_agents_guarded_tool.py")], tokens(server, tenant))
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("the run stopped for ledger approval apr_"), lines
    assert lines[1:] == [
        "a reviewer approved it in the ledger; approving the interruption and resuming:",
        "  (wiring 100 to acct-1)",
        "-> Done: the money is on its way.",
    ]


def test_the_mcp_gateway_example(server, tenant, tmp_path):
    config = tomllib.loads((MCP_EXAMPLE / "gateway.toml").read_text())
    config["ledger"]["target"] = server.target
    config["run"] = {"request_id": f"mcp-example-{uuid.uuid4().hex}"}
    config["upstream"]["command"] = ["{python}", str(MCP_EXAMPLE / "mail_server.py")]
    outbox = tmp_path / "outbox.jsonl"
    config["upstream"]["env"] = {"MAIL_OUTBOX": str(outbox)}
    config_path = tmp_path / "gateway.json"
    config_path.write_text(json.dumps(config))
    environment = {
        "EFFECT_LEDGER_GATEWAY_CONFIG": str(config_path),
        "EFFECT_LEDGER_TOKEN": tenant.tokens["agent"],
        "EFFECT_LEDGER_ADMIN_TOKEN": tenant.tokens["admin"],
    }
    registered = run_example(
        ["-m", "effect_ledger_client.adapters.mcp_gateway", "--config", str(config_path), "--register-contracts"],
        environment,
        cwd=MCP_EXAMPLE,
    )
    assert registered.returncode == 0, registered.stderr

    def call_tool(*arguments: str) -> tuple[int, str, dict]:
        completed = run_example(["call_tool.py", *arguments], environment, cwd=MCP_EXAMPLE)
        head, _, meta = completed.stdout.partition("_meta: ")
        return completed.returncode, head.strip(), json.loads(meta) if meta else {}

    email = json.dumps({"to": "bob@example.com", "subject": "Hi", "body": "Hello"})
    code, first, meta = call_tool("send_email", email)
    assert code == 0 and first == "result: queued message 1 to bob@example.com", first
    assert meta["effect-ledger/outcome"] == "SUCCEEDED"
    code, again, meta = call_tool("send_email", email)
    assert code == 0 and again == first and meta["effect-ledger/outcome"] == "DUPLICATE"
    code, refused, meta = call_tool("send_email", json.dumps({"to": "nobody", "subject": "Hi"}))
    assert code == 1 and refused.startswith("error: ") and "550 no such recipient" in refused
    assert meta["effect-ledger/outcome"] == "FAILED"  # gateway.toml: error_outcome = "failed"
    assert len(outbox.read_text().splitlines()) == 1
