"""The console as an ASGI application: ``create_app(ConsoleSettings(server=...))``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from effect_ledger_client.console import pages
from effect_ledger_client.console.web import (
    HERE,
    TOKEN_LENGTH_MAX,
    Console,
    ConsoleSettings,
    SecurityHeaders,
    action,
    field_text,
    page,
    refused_csrf,
)
from effect_ledger_client.errors import LedgerError, PermissionDenied, Unauthenticated
from effect_ledger_client.proto import approvals_pb2, runs_pb2

SWEEP_INTERVAL_SECONDS = 60.0
# One WatchApprovals call lives this long at most; the feed then resumes from its last sequence.
WATCH_CALL_SECONDS = 240.0
# Changes are announced to the page at most this often (a burst becomes one refresh).
ANNOUNCE_INTERVAL_SECONDS = 0.5
WATCH_RETRY_SECONDS = 5.0


async def sign_in_page(console: Console, request: Request) -> Response:
    session = console.session_of(request)
    if session is not None and session.signed_in:
        return RedirectResponse("/approvals", status_code=303)
    if session is None:
        session = console.sessions.new_anonymous()
    if request.query_params.get("expired") == "1":
        session.flash("error", "The gate no longer accepts that token: sign in again.")
    response = console.render(request, "sign_in.html", session)
    console.set_cookie(request, response, session)
    await console.close_dropped()
    return response


async def sign_in(console: Console, request: Request) -> Response:
    session = console.session_of(request)
    form = await request.form(max_files=0, max_fields=8, max_part_size=TOKEN_LENGTH_MAX * 2)
    if session is None or not session.csrf_matches(field_text(form, "csrf_token")):
        return refused_csrf()
    token = field_text(form, "token")
    if not token or len(token) > TOKEN_LENGTH_MAX:
        session.flash("error", "Paste a bearer token.")
        return console.render(request, "sign_in.html", session, status_code=400)
    ledger = console.settings.ledger(token)
    try:
        await ledger.runs.ListRuns(runs_pb2.ListRunsRequest(page_size=1))
    except PermissionDenied:
        pass  # the token is valid; its roles do not list runs
    except Unauthenticated as error:
        await ledger.close()
        session.flash("error", f"The gate refused that token ({error.reason}).")
        return console.render(request, "sign_in.html", session, status_code=401)
    except LedgerError as error:
        await ledger.close()
        session.flash("error", f"The gate could not be asked: {error.reason}: {error.message}")
        return console.render(request, "sign_in.html", session, status_code=502)
    signed = console.sessions.sign_in(session, token, ledger)
    response = RedirectResponse("/approvals", status_code=303)
    console.set_cookie(request, response, signed)
    await console.close_dropped()
    return response


async def sign_out(console: Console, request: Request) -> Response:
    session = console.session_of(request)
    form = await request.form(max_files=0, max_fields=4, max_part_size=1024)
    if session is None or not session.csrf_matches(field_text(form, "csrf_token")):
        return refused_csrf()
    console.sessions.end(session)
    await console.close_dropped()
    response = RedirectResponse("/sign-in", status_code=303)
    console.clear_cookie(request, response)
    return response


async def approval_events(console: Console, request: Request) -> Response:
    """Server-sent events: ``approvals`` whenever the tenant's approvals change."""
    session = console.session_of(request)
    if session is None or not session.signed_in:
        return Response("sign in first", status_code=401)
    return EventSourceResponse(_announcements(session), ping=15)


async def _announcements(session) -> AsyncIterator[dict]:
    changed = asyncio.Event()
    watcher = asyncio.create_task(_watch(session, changed))
    waiter: asyncio.Task | None = None
    try:
        while session.signed_in:
            waiter = asyncio.create_task(changed.wait())
            done, _ = await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                return  # the feed ended: the session ended, or its token was refused
            changed.clear()
            yield {"event": "approvals", "data": "changed"}
            await asyncio.sleep(ANNOUNCE_INTERVAL_SECONDS)
    finally:
        for task in (waiter, watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


async def _watch(session, changed: asyncio.Event) -> None:
    """Follows WatchApprovals from now on (the tenant's history is not replayed), resuming after
    each call ends from the last event seen. A stream started "from now" (no event seen yet) also
    tells the page to refresh once, so that what changed before it started is shown."""
    after_sequence: int | None = None  # None: no event seen yet, watch from now
    while session.signed_in and session.ledger is not None:
        if after_sequence is None:
            request = approvals_pb2.WatchApprovalsRequest(from_now=True)
            changed.set()
        else:
            request = approvals_pb2.WatchApprovalsRequest(after_sequence=after_sequence)
        stream = session.ledger.approvals.WatchApprovals(request, timeout=WATCH_CALL_SECONDS)
        try:
            async for event in stream:
                after_sequence = event.sequence
                changed.set()
        except Unauthenticated:
            return
        except LedgerError:
            await asyncio.sleep(WATCH_RETRY_SECONDS)
        finally:
            stream.cancel()


def create_app(settings: ConsoleSettings) -> Starlette:
    console = Console(settings)

    async def sweep() -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_SECONDS)
            console.sessions.sweep()
            await console.close_dropped()

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(sweep())
        try:
            yield
        finally:
            sweeper.cancel()
            console.sessions.end_all()
            await console.close_dropped()

    def bound(function):
        async def endpoint(request: Request) -> Response:
            return await function(console, request)

        return endpoint

    routes = [
        Route("/", lambda request: RedirectResponse("/approvals", status_code=303)),
        Route("/sign-in", bound(sign_in_page), methods=["GET"]),
        Route("/sign-in", bound(sign_in), methods=["POST"]),
        Route("/sign-out", bound(sign_out), methods=["POST"]),
        Route("/approvals", page(console, pages.approvals_page)),
        Route("/approvals/fragment", page(console, pages.approvals_fragment)),
        Route("/approvals/events", bound(approval_events)),
        Route("/approvals/{approval_id}", page(console, pages.approval_page), methods=["GET"]),
        Route("/approvals/{approval_id}/decide", action(console, pages.decide_approval), methods=["POST"]),
        Route("/runs", page(console, pages.runs_page)),
        Route("/runs/{run_id}", page(console, pages.run_page)),
        Route("/effects", page(console, pages.effects_page)),
        Route("/effects/{effect_id}/reconcile", action(console, pages.reconcile_effect), methods=["POST"]),
        Route("/budgets", page(console, pages.budgets_page)),
        Route("/decisions/{decision_id}", page(console, pages.decision_page)),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(SecurityHeaders)], lifespan=lifespan)
    app.state.console = console
    return app
