"""The argument checker's worker pool (service/argument_checks.py), with real worker processes:
one tenant's flood of costly checks neither fails another tenant's check nor holds it up for
the whole flood, and a check's wait in the queue never counts as a stuck worker."""

from __future__ import annotations

import asyncio
import time

import pytest

from effect_ledger.errors import InvalidArgument
from effect_ledger.service.argument_checks import ArgumentChecker

BRANCH = {"type": "array", "items": {"$ref": "#/$defs/nested"}}
# Two branches at each of 30 levels: the check spends its whole step budget (about 0.3 s).
COSTLY_SCHEMA = {
    "type": "object",
    "properties": {"x": {"$ref": "#/$defs/nested"}},
    "$defs": {"nested": {"anyOf": [BRANCH, BRANCH]}},
}


def costly_arguments() -> dict:
    nested: object = 1
    for _ in range(30):
        nested = [nested]
    return {"x": nested}


@pytest.mark.asyncio
async def test_a_flood_of_one_tenant_neither_fails_nor_holds_up_another_tenant():
    """One worker; a check stuck for 1 s would restart it. Tenant A queues six costly checks,
    then tenant B one: together they take longer than that 1 s, yet none fails (the time of a
    check counts from when the worker starts it), and B's check is the second or third to be
    answered, not the seventh (tenants take turns)."""
    checker = ArgumentChecker(workers=1, check_seconds_max=30.0)
    try:
        # The worker starts (a second or more on a loaded machine); then checks are held to 1 s.
        assert await checker.violations({"type": "object"}, {}, "warm-up", "tool", 1) == []
        checker.check_seconds_max = 1.0
        answered: list[tuple[str, str]] = []

        async def check(tenant_id: str) -> None:
            try:
                await checker.violations(COSTLY_SCHEMA, costly_arguments(), tenant_id, "tool", 1)
                answered.append((tenant_id, "checked"))
            except InvalidArgument as refusal:
                answered.append((tenant_id, refusal.reason))

        started = time.monotonic()
        flood = [asyncio.create_task(check("tenant-a")) for _ in range(6)]
        await asyncio.sleep(0)  # A's checks are queued first
        await asyncio.gather(*flood, check("tenant-b"))
        busy = time.monotonic() - started
        assert busy > checker.check_seconds_max, f"the checks were not costly ({busy:.2f} s): the test measures nothing"
        assert {reason for _tenant, reason in answered} == {"ARGUMENTS_CHECK_TOO_COSTLY"}, answered
        assert len(answered) == 7
        assert [tenant for tenant, _reason in answered].index("tenant-b") <= 2, answered
    finally:
        checker.close()


@pytest.mark.asyncio
async def test_a_check_whose_call_ends_while_it_waits_gives_its_turn_up():
    """A queued check whose call is cancelled is dropped from the queue; the worker goes on to
    the next one, and the pool is not left counting it."""
    checker = ArgumentChecker(workers=1, check_seconds_max=5.0)
    try:
        running = asyncio.create_task(checker.violations(COSTLY_SCHEMA, costly_arguments(), "a", "tool", 1))
        waiting = asyncio.create_task(checker.violations({"type": "object"}, {}, "a", "tool", 2))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(InvalidArgument):
            await running
        assert await checker.violations({"type": "object"}, {}, "b", "tool", 3) == []
        assert checker._running == 0 and not checker._waiting
    finally:
        checker.close()
