"""Checking arguments against a tool's schema, away from the event loop.

A check is pure Python (jsonschema) and may take up to its step budget, about 0.3 s at worst
(``domain/schemas.py``). Run on the server's event loop, or on a thread of the same process (the
interpreter lock is not fair to the loop against several busy threads), it would hold every
other call for that long. So checks run in a small pool of worker processes of their own
(spawned on first use, never forked from a process that runs gRPC): the event loop only sends
the schema and the arguments and waits. Each worker keeps its own cache of compiled schemas per
(tenant, tool, revision). Registration's checks of a new schema (``schema_problems``: RE2
compiles each pattern, which can take tens of milliseconds) run there too.

Tenants take turns. At most one check per worker is handed to the pool at a time; the others
wait here, in a queue per tenant, and a free worker takes the next check of the next tenant in
turn. So one tenant's flood of costly checks makes another tenant's check wait for the checks
already running and one check of each other tenant waiting, never for the whole flood. A check that waits is given up when its
call ends (its deadline, a cancellation), and only then.

A check's time is counted from when a worker starts it (it is handed to the pool only when a
worker is free). One that outlives ``CHECK_SECONDS_MAX`` means a stuck worker (the budget makes
that a bug): its call fails closed (UNAVAILABLE), and the pool is started again, which fails
the checks then running closed too. A worker that dies fails the checks it was running closed,
and the pool is started again for the next call. A check's wait in the queue never restarts
anything.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from effect_ledger.domain.schemas import argument_violations, schema_problems
from effect_ledger.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    LedgerError,
    PreconditionViolation,
    Unavailable,
)

log = logging.getLogger(__name__)

WORKERS = 2
# From when a worker starts a check. The first check also waits for the workers to start
# (spawned on first use: a server whose tools have no schema never starts them), about a second.
CHECK_SECONDS_MAX = 10.0


def _check(schema: Any, arguments: Any, tenant_id: str, tool: str, revision: int) -> tuple[Any, ...]:
    """In a worker: the violations, or the refusal, as plain values (exceptions with keyword
    arguments do not survive pickling)."""
    try:
        found = argument_violations(schema, arguments, tenant_id=tenant_id, tool=tool, revision=revision)
    except InvalidArgument as error:
        return ("invalid", error.message, error.reason, [(v.field, v.description) for v in error.violations])
    except FailedPrecondition as error:
        return (
            "precondition",
            error.message,
            error.reason,
            [(v.type, v.subject, v.description) for v in error.violations],
        )
    return ("ok", [(v.field, v.description) for v in found])


def _schema_problems(schema: Any) -> list[str]:
    """In a worker: registration's refusals of a schema (its compiled patterns stay here)."""
    problems, _patterns = schema_problems(schema)
    return problems


class ArgumentChecker:
    def __init__(self, workers: int = WORKERS, check_seconds_max: float = CHECK_SECONDS_MAX) -> None:
        self.workers = workers
        self.check_seconds_max = check_seconds_max
        self._pool: ProcessPoolExecutor | None = None
        # Checks handed to the pool and not finished (at most ``workers``), and the calls
        # waiting for a worker: a queue per tenant, tenants in turn (the first one's next).
        self._running = 0
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def _restart(self, pool: ProcessPoolExecutor) -> None:
        """Stop ``pool`` and start another for the next check, unless that was done already
        (every check of a broken pool fails, each restarting only the pool it ran in)."""
        if self._pool is not pool:
            return
        self._pool = None
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            pool.shutdown(wait=False, cancel_futures=True)

    async def _turn(self, tenant_id: str) -> None:
        """Returns when a worker is free for this call (counted in ``_running``)."""
        if self._running < self.workers:
            self._running += 1
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant_id, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._finished()  # handed a worker as the call ended: pass it on
            else:
                queue = self._waiting.get(tenant_id)
                if queue is not None and turn in queue:
                    queue.remove(turn)
                    if not queue:
                        del self._waiting[tenant_id]
            raise

    def _finished(self, done: asyncio.Future[Any] | None = None) -> None:
        """A worker is free: the next tenant in turn gets it (or no one waits)."""
        if done is not None and not done.cancelled():
            done.exception()  # retrieved: a check whose call has ended is not reported twice
        while self._waiting:
            tenant_id, queue = next(iter(self._waiting.items()))
            turn = queue.popleft()
            del self._waiting[tenant_id]
            if queue:
                self._waiting[tenant_id] = queue  # to the back of the line
            if not turn.done():
                turn.set_result(None)
                return
        self._running -= 1

    async def _in_worker(self, unavailable: str, tenant_id: str, function: Callable[..., Any], *arguments: Any) -> Any:
        """``function(*arguments)`` in a worker, when this tenant's turn comes; UNAVAILABLE
        (with the message ``unavailable``) when it cannot be done."""
        await self._turn(tenant_id)
        loop = asyncio.get_running_loop()
        try:
            pool = self._executor()
            future = loop.run_in_executor(pool, function, *arguments)
        except BaseException:
            self._finished()
            raise
        # The worker is free when the check ends, even if its call has ended before (shielded:
        # a call that ends does not end the check that a worker runs).
        future.add_done_callback(self._finished)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.check_seconds_max)
        except (BrokenProcessPool, TimeoutError, OSError) as error:
            log.warning("argument check failed (%s): restarting the checking workers", type(error).__name__)
            self._restart(pool)
            raise Unavailable(unavailable, reason="ARGUMENTS_CHECK_UNAVAILABLE") from None

    async def violations(
        self, schema: Any, arguments: Any, tenant_id: str, tool: str, revision: int
    ) -> list[FieldViolation]:
        unavailable = "the arguments could not be checked against the tool's schema; retry"
        result = await self._in_worker(unavailable, tenant_id, _check, schema, arguments, tenant_id, tool, revision)
        kind = result[0]
        if kind == "ok":
            return [FieldViolation(field, description) for field, description in result[1]]
        refusal: LedgerError
        if kind == "invalid":
            refusal = InvalidArgument(
                result[1], reason=result[2], violations=[FieldViolation(f, d) for f, d in result[3]]
            )
        else:
            refusal = FailedPrecondition(
                result[1], reason=result[2], violations=[PreconditionViolation(t, s, d) for t, s, d in result[3]]
            )
        raise refusal

    async def schema_problems(self, schema: Any, tenant_id: str) -> list[str]:
        """Registration's refusals of ``schema`` (``domain.schemas.schema_problems``), in a worker."""
        unavailable = "the arguments schema could not be checked; retry"
        problems: list[str] = await self._in_worker(unavailable, tenant_id, _schema_problems, schema)
        return problems

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


CHECKER = ArgumentChecker()
