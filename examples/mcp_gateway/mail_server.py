"""A tiny MCP server with real side effects, to put behind the gateway.

`send_email` appends one line to the outbox file (`MAIL_OUTBOX`, default `outbox.jsonl`), and
deduplicates by the provider idempotency key the gateway passes in the request's `_meta`
(`effect-ledger/provider_key`), as a mail provider with idempotency keys does: a retry the
ledger allows under the same key (RETRY_SAME_KEY) gets the first answer instead of a second email.
`publish_newsletter` appends one line per subscriber to the same file; `list_outbox` reads it;
`purge_outbox` empties it. A recipient without an `@` is refused (an MCP tool error, `isError`
true), as a mail provider would refuse it. When `MAIL_CALL_LOG` names a file, every call that
reaches this server is appended to it first, refused ones included, so a caller can count what
reached the upstream.

    python mail_server.py        # speaks MCP over stdio
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

OUTBOX = Path(os.environ.get("MAIL_OUTBOX", "outbox.jsonl"))
CALL_LOG = os.environ.get("MAIL_CALL_LOG", "")
PROVIDER_KEY_META = "effect-ledger/provider_key"
SUBSCRIBERS = ("ana@example.com", "bo@example.com", "chen@example.com")

server = MCPServer("mail")


def _log_call(tool: str, arguments: dict) -> None:
    if CALL_LOG:
        with open(CALL_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps({"tool": tool, "arguments": arguments}, sort_keys=True) + "\n")


def _messages() -> list[dict]:
    if not OUTBOX.exists():
        return []
    with OUTBOX.open(encoding="utf-8") as outbox:
        return [json.loads(line) for line in outbox if line.strip()]


def _append(message: dict) -> int:
    """Append one message to the outbox; returns its number (1-based)."""
    with OUTBOX.open("a", encoding="utf-8") as outbox:
        outbox.write(json.dumps(message, sort_keys=True) + "\n")
    return len(_messages())


@server.tool()
def send_email(to: str, subject: str, ctx: Context, body: str = "") -> str:
    """Send one email."""
    _log_call("send_email", {"to": to, "subject": subject, "body": body})
    if "@" not in to:
        raise ToolError(f"550 no such recipient: {to!r}")
    key = (ctx.request_context.meta or {}).get(PROVIDER_KEY_META)
    for number, message in enumerate(_messages(), start=1):
        if key and message.get("key") == key:
            return f"queued message {number} to {message['to']}"
    number = _append({"to": to, "subject": subject, "body": body, "key": key})
    return f"queued message {number} to {to}"


@server.tool()
def publish_newsletter(issue: str, body: str) -> str:
    """Send a newsletter issue to every subscriber. Cannot be taken back."""
    _log_call("publish_newsletter", {"issue": issue, "body": body})
    for subscriber in SUBSCRIBERS:
        _append({"to": subscriber, "subject": issue, "body": body})
    return f"published {issue!r} to {len(SUBSCRIBERS)} subscribers"


@server.tool()
def list_outbox() -> list[dict]:
    """Every message sent so far."""
    _log_call("list_outbox", {})
    return _messages()


@server.tool()
def purge_outbox() -> str:
    """Delete every message in the outbox."""
    _log_call("purge_outbox", {})
    OUTBOX.write_text("", encoding="utf-8")
    return "purged"


if __name__ == "__main__":
    server.run("stdio")
