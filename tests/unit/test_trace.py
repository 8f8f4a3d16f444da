"""The run trace as a hash chain (domain/trace.py): tampering is found at the right revision."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime, timedelta, timezone

import pytest

from effect_ledger.domain.trace import GENESIS_HASH, event_hash, first_break, timestamp_text

TENANT, RUN = "acme", "run_1"
T0 = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)
EVENT_SPECS = [
    ("run.created", {"labels": {}}, "agent-1"),
    ("effect.authorized", {"effect_id": "eff_1", "attempt_id": "att_1"}, "agent-1"),
    ("attempt.dispatched", {"attempt_id": "att_1"}, "agent-1"),
    ("attempt.succeeded", {"attempt_id": "att_1", "receipt": {"ref": "msg-42"}}, "agent-1"),
    ("effect.reconciled", {"effect_id": "eff_1"}, "reviewer-1"),
]


def build_chain() -> list[dict]:
    events, previous = [], GENESIS_HASH
    for index, (event_type, payload, principal) in enumerate(EVENT_SPECS):
        event = {
            "revision": index + 1,
            "type": event_type,
            "payload": payload,
            "principal_id": principal,
            "created_at": T0 + timedelta(milliseconds=index),
            "prev_hash": previous,
        }
        event["hash"] = rehash(event)
        events.append(event)
        previous = event["hash"]
    return events


def rehash(event: dict) -> str:
    return event_hash(
        prev_hash=event["prev_hash"],
        tenant_id=TENANT,
        run_id=RUN,
        revision=event["revision"],
        event_type=event["type"],
        payload=event["payload"],
        principal_id=event["principal_id"],
        created_at=event["created_at"],
    )


def check(events: list[dict], head_revision: int | None = None, head_hash: str | None = None):
    chain = build_chain()
    return first_break(
        TENANT,
        RUN,
        events,
        len(chain) if head_revision is None else head_revision,
        chain[-1]["hash"] if head_hash is None else head_hash,
    )


def test_an_intact_chain_has_no_break():
    events = build_chain()
    assert events[0]["prev_hash"] == GENESIS_HASH
    assert all(later["prev_hash"] == earlier["hash"] for earlier, later in itertools.pairwise(events))
    assert len({e["hash"] for e in events}) == len(events)
    assert check(events) is None


def test_an_empty_run_has_no_break():
    assert first_break(TENANT, RUN, [], 0, GENESIS_HASH) is None


def test_an_edited_payload_is_found_at_its_revision():
    events = build_chain()
    events[1]["payload"] = {"effect_id": "eff_1", "attempt_id": "att_2"}
    found = check(events)
    assert (found.run_id, found.revision) == (RUN, 2)
    assert "edited" in found.problem


def test_an_edit_with_a_recomputed_hash_breaks_the_next_link():
    events = build_chain()
    events[1]["payload"] = {"effect_id": "eff_1", "attempt_id": "att_2"}
    events[1]["hash"] = rehash(events[1])
    found = check(events)
    assert found.revision == 3
    assert "prev_hash" in found.problem


@pytest.mark.parametrize("field", ["type", "principal_id"])
def test_other_edited_fields_are_found(field):
    events = build_chain()
    events[3][field] = events[3][field] + "x"
    assert check(events).revision == 4


def test_an_edited_created_at_is_found_at_its_revision():
    events = build_chain()
    events[2]["created_at"] = events[2]["created_at"] + timedelta(microseconds=1)
    found = check(events)
    assert found.revision == 3 and "edited" in found.problem


def test_the_same_instant_in_another_time_zone_is_not_an_edit():
    events = build_chain()
    events[2]["created_at"] = events[2]["created_at"].astimezone(timezone(timedelta(hours=2)))
    assert check(events) is None
    assert timestamp_text(events[2]["created_at"]) == "2026-11-29T12:00:00.125456Z"


def test_a_deleted_middle_event_is_found_at_the_missing_revision():
    events = build_chain()
    del events[2]
    found = check(events)
    assert found.revision == 3
    assert found.problem == "revision 3 missing (found 4)"


def test_a_deleted_first_event_is_found():
    events = build_chain()[1:]
    assert check(events).revision == 1


def test_two_swapped_events_are_found_at_the_first_of_them():
    events = build_chain()
    events[1], events[2] = events[2], events[1]
    assert check(events).revision == 2


def test_two_events_with_swapped_contents_are_found_at_the_first_of_them():
    events = build_chain()
    swapped = copy.deepcopy(events)
    for a, b in ((1, 2), (2, 1)):
        for key in ("type", "payload", "principal_id", "created_at", "hash", "prev_hash"):
            swapped[a][key] = events[b][key]
    found = check(swapped)
    assert found.revision == 2 and "prev_hash" in found.problem


def test_a_truncated_tail_is_found_after_the_last_event():
    events = build_chain()[:3]
    found = check(events)  # the run head still says revision 5
    assert found.revision == 4
    assert found.problem == "run head is revision 5; the chain ends at 3"


def test_a_head_hash_that_does_not_match_the_last_event_is_found():
    found = check(build_chain(), head_hash="0" * 64)
    assert found.revision == 6


def test_a_hash_depends_on_tenant_and_run():
    event = build_chain()[0]
    assert first_break("other-tenant", RUN, [event], 1, event["hash"]).revision == 1
    assert first_break(TENANT, "run_2", [event], 1, event["hash"]).revision == 1
