"""The worked examples run as written against a real server (tokens, port and request ids
swapped in): README.md's two Python blocks, and clients/python/README.md's five-minute guide."""

from __future__ import annotations

import contextlib
import io
import json
import re
import textwrap
from pathlib import Path

import pytest

from effect_ledger_client import Ledger, Rejected
from effect_ledger_client.proto import common_pb2, gate_pb2, runs_pb2

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CLIENT_README = REPO / "clients" / "python" / "README.md"
PYTHON_LINES_MAX = 10
NUMBER_WORDS = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
}


def python_blocks(path: Path, section: str) -> list[str]:
    """The ```python blocks of a section (up to the next heading of its level or higher)."""
    text = path.read_text()
    heading = re.search(rf"^(#+) {re.escape(section)}\n", text, re.MULTILINE)
    assert heading, f"{path.name}: no section {section!r}"
    level = len(heading.group(1))
    rest = text[heading.end() :]
    following = re.search(rf"^#{{1,{level}}} ", rest, re.MULTILINE)
    body = rest[: following.start()] if following else rest
    return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", body, re.DOTALL)]


def run_block(code: str, source: Path, namespace: dict, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        code = code.replace(old, new)
    assert "elt_..." not in code and "127.0.0.1:50051" not in code, "a placeholder was left"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(code, str(source), "exec"), namespace)
    return printed.getvalue()


def effects_of_run(server, token: str, run_id: str) -> list[gate_pb2.Effect]:
    """Every effect the run's trace names."""
    with Ledger(server.target, token) as reader:
        events = reader.runs.ListRunEvents(runs_pb2.ListRunEventsRequest(run_id=run_id)).events
        effect_ids = {json.loads(event.payload_json or b"{}").get("effect_id") for event in events}
        return [
            reader.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id))
            for effect_id in sorted(filter(None, effect_ids))
        ]


def text_before(path: Path, block: str) -> str:
    """The paragraph just above a ```python block."""
    text = path.read_text()
    start = text.index("```python\n" + block)
    return text[:start].rstrip().rsplit("\n\n", 1)[-1]


def test_the_worked_example_says_what_it_is():
    """The README's claims about its example: the agent's part is N lines (N spelled out, and at
    most ten), and the contract is one-time setup, apart from it."""
    admin_block, agent_block = python_blocks(README, "A worked example")
    claim = re.search(r"The agent's part is these (\w+) lines of Python", text_before(README, agent_block))
    assert claim, "the paragraph above the agent's block says how many lines it is"
    agent_lines = len(agent_block.strip().splitlines())
    assert NUMBER_WORDS.get(claim.group(1)) == agent_lines <= PYTHON_LINES_MAX, (claim.group(1), agent_lines)
    assert "guarded" in agent_block or "guard(" in agent_block
    assert "One-time setup, not part of the agent's code" in text_before(README, admin_block)
    assert "PutToolContract" in admin_block and "PutToolContract" not in agent_block


def test_the_worked_example_runs_and_sends_once(server, tenant):
    admin_block, agent_block = python_blocks(README, "A worked example")
    tenant.add("ops", "admin")
    tenant.add("mailer-agent", "agent")
    swaps = {
        "127.0.0.1:50051": server.target,
        "elt_...ops token...": tenant.tokens["ops"],
        "elt_...mailer-agent token...": tenant.tokens["mailer-agent"],
        'request_id="ticket-4711"': f'request_id="ticket-4711-{tenant.name}"',
    }
    run_block(admin_block, README, {}, swaps)
    namespace: dict = {}
    first = run_block(agent_block, README, namespace, swaps)
    assert first.strip() == "msg-8841"
    run_id = namespace["run"].run_id
    again = run_block(agent_block, README, namespace, swaps)  # the same run and key again
    assert again.strip() == "msg-8841" and namespace["run"].run_id == run_id
    (effect,) = effects_of_run(server, tenant.tokens["mailer-agent"], run_id)
    assert common_pb2.Stage.Name(effect.stage) == "SUCCEEDED" and len(effect.attempts) == 1
    assert (
        effect.target == "mailto:bob@example.com" and effect.idempotency_key == "ticket-4711/reply-to-bob@example.com"
    )


class FakeMailer:
    """The provider of the client README's guide: counts sends, refuses one address."""

    class Refused(Exception):
        pass

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send(self, *, to: str, idempotency_key: str) -> str:
        if to.startswith("nobody@"):
            raise self.Refused("no such mailbox")
        self.sent.append((to, idempotency_key))
        return f"msg-{len(self.sent)}"


def test_the_client_readme_guide_runs(server, tenant):
    contract_block, agent_block = python_blocks(CLIENT_README, "From nothing to a guarded tool in five minutes")
    tenant.add("ops", "admin")
    tenant.add("mailer-agent", "agent")
    swaps = {
        "127.0.0.1:50051": server.target,
        "elt_...ops token...": tenant.tokens["ops"],
        "elt_...mailer-agent token...": tenant.tokens["mailer-agent"],
        'request_id="ticket-4711"': f'request_id="ticket-4711-{tenant.name}"',
    }
    run_block(contract_block, CLIENT_README, {}, swaps)
    mailer = FakeMailer()
    namespace: dict = {"mailer": mailer}
    run_block(agent_block, CLIENT_README, namespace, swaps)
    receipt, send_welcome = namespace["receipt"], namespace["send_welcome"]
    assert receipt.reference == "msg-1" and receipt.detail == {"status": "queued"}
    assert send_welcome("bob@example.com") == receipt and len(mailer.sent) == 1
    with pytest.raises(Rejected):
        send_welcome("nobody@example.com")
    assert len(mailer.sent) == 1
