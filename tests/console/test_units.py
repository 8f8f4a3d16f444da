"""The console's pure parts: the hash chain checked as the server computes it, the session
table's bounds and expiry, and the screenshots docs/console.md shows."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.trace import event_hash as server_event_hash
from effect_ledger_client.console import chain
from effect_ledger_client.console.sessions import SessionLimits, SessionTable

TENANT, RUN = "t-acme", "run_1"
PAYLOADS = [
    {"request_id": ""},
    {"to": "zoë@example.com", "note": 'line\nbreak \u0001 "quoted" \\ 😀', "amount": 12, "ok": True},
    {"nested": {"b": [1, 2, {"c": None}], "a": "é"}},
]


def _events(tenant_id: str = TENANT) -> list[chain.ChainEvent]:
    events, previous = [], ""
    for revision, payload in enumerate(PAYLOADS, start=1):
        created_at = datetime(2026, 12, 1, 7, 0, revision, 123456, tzinfo=UTC)
        digest = server_event_hash(
            prev_hash=previous,
            tenant_id=tenant_id,
            run_id=RUN,
            revision=revision,
            event_type="effect.authorized",
            payload=payload,
            principal_id="agent-ü",
            created_at=created_at,
        )
        events.append(
            chain.ChainEvent(
                revision, "effect.authorized", canonical_bytes(payload), "agent-ü", created_at, previous, digest
            )
        )
        previous = digest
    return events


def _verify(events, tenant_id: str | None = TENANT, **overrides):
    head = events[-1] if events else None
    arguments = {
        "run_id": RUN,
        "head_revision": head.revision if head else 0,
        "head_hash": head.hash if head else "",
        "tenant_id": tenant_id,
        **overrides,
    }
    return chain.verify_chain(events, **arguments)


def test_hashes_match_the_servers():
    for event in _events():
        assert chain.event_hash(event, tenant_id=TENANT, run_id=RUN) == event.hash
    assert _verify(_events()).status == chain.VERIFIED


def test_without_the_tenant_only_the_links_are_checked():
    verdict = _verify(_events(), tenant_id=None)
    assert verdict.status == chain.LINKS_ONLY and "not" in verdict.detail and "recomputed" in verdict.detail


@pytest.mark.parametrize("damage", ["payload", "principal", "deleted", "reordered", "truncated", "tenant"])
def test_each_kind_of_damage_breaks_the_chain(damage):
    events = _events()
    head = events[-1]
    if damage == "payload":
        events[1] = replace(events[1], payload_json=json.dumps({"to": "mallory@example.com"}).encode())
    elif damage == "principal":
        events[2] = replace(events[2], principal_id="admin")
    elif damage == "deleted":
        del events[1]
    elif damage == "reordered":
        events[1], events[2] = events[2], events[1]
    elif damage == "truncated":
        events = events[:-1]
    verdict = _verify(
        events, tenant_id="t-other" if damage == "tenant" else TENANT, head_revision=head.revision, head_hash=head.hash
    )
    assert verdict.status == chain.BROKEN, damage
    assert verdict.broken_at_revision >= 1


def test_a_run_without_events_verifies_and_a_partial_read_says_so():
    assert _verify([]).status == chain.VERIFIED
    assert _verify(_events()[:2], head_revision=3, complete=False).status == chain.INCOMPLETE


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sessions_are_bounded_and_expire():
    clock = Clock()
    table = SessionTable(
        SessionLimits(
            signed_in_max=2, idle_seconds_max=60, lifetime_seconds_max=600, anonymous_max=2, anonymous_seconds_max=30
        ),
        clock=clock,
    )
    first = table.sign_in(table.new_anonymous(), "token-1", None)
    second = table.sign_in(table.new_anonymous(), "token-2", None)
    assert table.get(first.session_id) is first  # first is now the most recently used
    third = table.sign_in(table.new_anonymous(), "token-3", None)
    assert table.get(second.session_id) is None and second.token is None  # dropped: least recently used
    assert table.get(first.session_id) is first and table.get(third.session_id) is third
    assert second in table.take_dropped()

    clock.now += 61
    assert table.get(first.session_id) is None  # idle too long
    anonymous = table.new_anonymous()
    clock.now += 31
    assert table.get(anonymous.session_id) is None

    fresh = table.sign_in(table.new_anonymous(), "token-4", None)
    for _ in range(20):
        clock.now += 50
        assert table.get(fresh.session_id) is fresh or clock.now - fresh.created_at_monotonic > 600
    assert table.get(fresh.session_id) is None  # past its lifetime although used


def test_signing_in_gives_a_new_id_and_csrf_token():
    table = SessionTable(SessionLimits())
    anonymous = table.new_anonymous()
    signed = table.sign_in(anonymous, "token", None)
    assert signed.session_id != anonymous.session_id and signed.csrf_token != anonymous.csrf_token
    assert table.get(anonymous.session_id) is None
    assert signed.csrf_matches(signed.csrf_token) and not signed.csrf_matches(anonymous.csrf_token)
    assert table.get("x" * 500) is None


# --- the screenshots of docs/console.md ------------------------------------------------------

REPOSITORY = Path(__file__).resolve().parents[2]


def _screenshots_taken() -> set[str]:
    """The names test_browser.py screenshots: ``<browsing>.visit("name")`` and ``.screenshot("name")``."""
    tree = ast.parse((Path(__file__).parent / "test_browser.py").read_text())
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("visit", "screenshot")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


def test_the_docs_show_each_screenshot_the_browser_tests_take():
    taken = _screenshots_taken()
    shown = set(re.findall(r"\]\(console/([\w.-]+)\.png\)", (REPOSITORY / "docs" / "console.md").read_text()))
    stored = {path.stem for path in (REPOSITORY / "docs" / "console").glob("*.png")}
    assert len(taken) >= 10, taken
    assert taken == shown, f"taken, not in docs/console.md: {taken - shown}; shown, not taken: {shown - taken}"
    assert shown == stored, (
        f"shown, not in docs/console/: {shown - stored}; in docs/console/, not shown: {stored - shown}"
    )
