"""Wake-ups for the approval feed: PostgreSQL LISTEN/NOTIFY, or one cheap poll on SQLite.

A WatchApprovals stream that has read everything after its cursor waits for a wake-up and does
no database work until one comes. One ``FeedWakeups`` per server process delivers them:

- PostgreSQL: a trigger (migration 0005) calls ``pg_notify`` on ``CHANNEL`` for every
  ``approval_events`` row with ``{"tenant_id", "sequence", "approval_id"}``: ids, never rows
  (a payload is limited to 8000 bytes). One dedicated connection per process, outside the pool,
  in autocommit, LISTENs and hands each notification to the tenant's watchers whose cursor is
  behind it. If that connection drops, it is reconnected with backoff; once LISTEN is back,
  every watcher is woken once and re-reads from its cursor, so nothing committed meanwhile is
  missed. Until then, the tenants' counters are polled every ``DISCONNECTED_POLL_INTERVAL_SECONDS``.
- SQLite has no notifications: every ``SQLITE_POLL_INTERVAL_SECONDS`` one query reads the
  feed counters of the tenants being watched (a primary-key lookup each) and wakes the watchers
  that are behind. The cost is one query per second per process, whatever the number of streams.

Every event up to a counter value, or up to a notified sequence, is committed and visible: a
sequence is taken from a counter row locked until commit, so sequences commit in order. A woken
watcher therefore re-reads through the normal unit of work (authenticated, as the caller) and
what it sends is always what the database committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from effect_ledger.storage import approval_store
from effect_ledger.storage.engine import Database

log = logging.getLogger(__name__)

CHANNEL = "effect_ledger_approval_events"
# The LISTEN connection's name in pg_stat_activity: "effect-ledger-listen/<server process id>".
LISTEN_APPLICATION_NAME = "effect-ledger-listen"
# Open WatchApprovals streams per process; beyond it a stream is refused (RESOURCE_EXHAUSTED).
# Half of the default --maximum-concurrent-rpcs (256), so streams alone never take every slot.
WATCHERS_MAX = 128
SQLITE_POLL_INTERVAL_SECONDS = 1.0
DISCONNECTED_POLL_INTERVAL_SECONDS = 2.0
RECONNECT_DELAY_SECONDS_MIN = 0.1
RECONNECT_DELAY_SECONDS_MAX = 5.0
# A database that does not answer the LISTEN connection's handshake is retried after this long.
LISTEN_CONNECT_TIMEOUT_SECONDS = 5
# TCP keepalives on the LISTEN connection: a silently dead peer (host gone, network cut) is
# noticed after about idle + interval * count = 40 s, without sending a query to a live one.
KEEPALIVES_IDLE_SECONDS = 10
KEEPALIVES_INTERVAL_SECONDS = 10
KEEPALIVES_COUNT = 3


@dataclass(eq=False)
class Watcher:
    """One open stream. ``scanned``: every event of the tenant up to this sequence has been read
    (through the stream's filters). ``announced``: the highest sequence the database announced."""

    feed: FeedWakeups
    scanned: int
    tenant_id: str | None = None
    announced: int = 0
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def begin_read(self) -> int:
        """Call before reading: a wake-up that arrives during the read is kept for the next wait.
        Returns the announced sequence the read is sure to see."""
        self.wakeup.clear()
        return self.announced

    def finish_read(self, tenant_id: str, last_sequence: int | None, announced_before: int, complete: bool) -> None:
        """After a read: ``last_sequence`` is the last event it returned, ``complete`` whether it
        returned every match (not a full batch), so that everything up to ``announced_before``
        has been seen even when nothing matched the filters."""
        self.feed.attach(self, tenant_id)
        if last_sequence is not None:
            self.scanned = max(self.scanned, last_sequence)
        if complete:
            self.scanned = max(self.scanned, announced_before)

    async def wait(self) -> None:
        await self.wakeup.wait()


class FeedWakeups:
    """The process's watchers by tenant, and the task that wakes them."""

    def __init__(self, database: Database, watchers_max: int = WATCHERS_MAX) -> None:
        self.database = database
        self.watchers_max = watchers_max
        self.listening = False
        self._by_tenant: dict[str, set[Watcher]] = {}
        # Watchers whose first read (which names their tenant) is in flight: woken by any change.
        self._unattached: set[Watcher] = set()
        self._count = 0

    @contextlib.contextmanager
    def watching(self, after_sequence: int) -> Iterator[Watcher | None]:
        """A registered watcher for the life of the block, or None when ``watchers_max`` are open."""
        if self._count >= self.watchers_max:
            yield None
            return
        watcher = Watcher(self, scanned=after_sequence)
        self._count += 1
        self._unattached.add(watcher)
        try:
            yield watcher
        finally:
            self._count -= 1
            self._unattached.discard(watcher)
            if watcher.tenant_id is not None:
                tenant_watchers = self._by_tenant.get(watcher.tenant_id, set())
                tenant_watchers.discard(watcher)
                if not tenant_watchers:
                    self._by_tenant.pop(watcher.tenant_id, None)

    def attach(self, watcher: Watcher, tenant_id: str) -> None:
        if watcher.tenant_id == tenant_id:
            return
        assert watcher.tenant_id is None, "a stream's tenant never changes"
        self._unattached.discard(watcher)
        watcher.tenant_id = tenant_id
        self._by_tenant.setdefault(tenant_id, set()).add(watcher)

    def announce(self, tenant_id: str, sequence: int) -> None:
        """Every event of the tenant up to ``sequence`` is committed: wake whoever is behind."""
        for watcher in self._by_tenant.get(tenant_id, ()):
            if sequence > watcher.scanned:
                watcher.announced = max(watcher.announced, sequence)
                watcher.wakeup.set()
        for watcher in self._unattached:
            watcher.wakeup.set()

    def wake_everyone(self) -> None:
        for watchers in (self._unattached, *self._by_tenant.values()):
            for watcher in watchers:
                watcher.wakeup.set()

    def dispatch(self, payload: str) -> None:
        """One notification from the trigger. A payload this version cannot read (a newer
        trigger, during a rolling upgrade) wakes everyone: a wasted read, never a missed event."""
        try:
            message = json.loads(payload)
            tenant_id, sequence = message["tenant_id"], message["sequence"]
            if not isinstance(tenant_id, str) or not isinstance(sequence, int):
                raise ValueError("unexpected types")
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable approval notification %.200r: waking every watcher", payload)
            self.wake_everyone()
            return
        self.announce(tenant_id, sequence)

    # --- the task ------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: LISTEN on PostgreSQL (polling while disconnected), poll on SQLite."""
        if self.database.dialect != "postgresql":
            await self._poll(SQLITE_POLL_INTERVAL_SECONDS)
            return
        await asyncio.gather(self._listen(), self._poll(DISCONNECTED_POLL_INTERVAL_SECONDS))

    async def _poll(self, interval_seconds: float) -> None:
        """Read the counters of the watched tenants (only while nothing is pushed)."""
        while True:
            await asyncio.sleep(interval_seconds)
            tenants = sorted(self._by_tenant)
            if self.listening or not tenants:
                continue
            try:
                latest = await self.database.run(
                    lambda unit: approval_store.latest_sequences(unit.connection, tenants),  # noqa: B023 - awaited here
                    read_clock=False,
                )
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - the next pass tries again
                log.warning("approval feed poll failed: %s", error)
                continue
            for tenant_id, sequence in latest.items():
                self.announce(tenant_id, sequence)

    def _listen_parameters(self) -> dict[str, Any]:
        engine = self.database.engine
        _, parameters = engine.dialect.create_connect_args(engine.url)
        parameters.pop("context", None)
        given = parameters.get("options", "")
        # An idle LISTEN connection is the point: never let idle_session_timeout close it.
        parameters["options"] = f"{given} -c idle_session_timeout=0".strip()
        return {
            **parameters,
            "autocommit": True,
            "application_name": f"{LISTEN_APPLICATION_NAME}/{os.getpid()}",
            "connect_timeout": LISTEN_CONNECT_TIMEOUT_SECONDS,
            "keepalives": 1,
            "keepalives_idle": KEEPALIVES_IDLE_SECONDS,
            "keepalives_interval": KEEPALIVES_INTERVAL_SECONDS,
            "keepalives_count": KEEPALIVES_COUNT,
        }

    async def _listen(self) -> None:
        delay = RECONNECT_DELAY_SECONDS_MIN
        parameters = self._listen_parameters()
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(**parameters) as connection:
                    await connection.execute(f"LISTEN {CHANNEL}")
                    # From here on every commit is announced; what committed before is found by
                    # the re-read every watcher now makes from its cursor.
                    self.listening = True
                    self.wake_everyone()
                    delay = RECONNECT_DELAY_SECONDS_MIN
                    log.info("approval feed: listening on %s", CHANNEL)
                    async for notification in connection.notifies():
                        self.dispatch(notification.payload)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - reconnect; polling covers the gap
                log.warning("approval feed: LISTEN connection lost (%s); reconnecting in %.1f s", error, delay)
            finally:
                self.listening = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_SECONDS_MAX)
