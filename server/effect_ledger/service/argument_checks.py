"""Checking arguments against a tool's schema, away from the event loop.

A check is pure Python (jsonschema) and may take up to its step budget, about 0.3 s at worst
(``domain/schemas.py``). Run on the server's event loop, or on a thread of the same process (the
interpreter lock is not fair to the loop against several busy threads), it would hold every
other call for that long. So checks run in a small pool of worker processes of their own
(spawned on first use, never forked from a process that runs gRPC): the event loop only sends
the schema and the arguments and waits. Each worker keeps its own cache of compiled schemas per
(tenant, tool, revision).

A worker that dies, or a check that outlives ``CHECK_SECONDS_MAX`` (the budget makes that a
bug), fails the call closed (UNAVAILABLE), and the pool is started again for the next call.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from effect_ledger.domain.schemas import argument_violations
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
# The first check also waits for the workers to start (spawned on first use: a server whose
# tools have no schema never starts them), about a second.
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


class ArgumentChecker:
    def __init__(self, workers: int = WORKERS) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def _restart(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            pool.shutdown(wait=False, cancel_futures=True)

    async def violations(
        self, schema: Any, arguments: Any, tenant_id: str, tool: str, revision: int
    ) -> list[FieldViolation]:
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor(), _check, schema, arguments, tenant_id, tool, revision)
            result = await asyncio.wait_for(future, CHECK_SECONDS_MAX)
        except (BrokenProcessPool, TimeoutError, OSError) as error:
            log.warning("argument check failed (%s): restarting the checking workers", type(error).__name__)
            self._restart()
            raise Unavailable(
                "the arguments could not be checked against the tool's schema; retry",
                reason="ARGUMENTS_CHECK_UNAVAILABLE",
            ) from None
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

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


CHECKER = ArgumentChecker()
