"""The console's plumbing: settings, security headers, sessions from cookies, CSRF, rendering."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from effect_ledger_client._channel import Pem
from effect_ledger_client.aio import AsyncLedger
from effect_ledger_client.console.sessions import Session, SessionLimits, SessionTable
from effect_ledger_client.errors import LedgerError, Unauthenticated
from effect_ledger_client.proto import approvals_pb2, budgets_pb2, common_pb2

HERE = Path(__file__).resolve().parent
COOKIE_NAME = "effect_ledger_console"
COOKIE_NAME_SECURE = "__Host-effect_ledger_console"
# What pages may load: only the console's own files; no inline script or style, no frames.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]
# A form is a few KiB; a token a few hundred bytes.
FORM_FIELD_LENGTH_MAX = 64 * 1024
TOKEN_LENGTH_MAX = 1024
# The HTTP status of a page the gate refused to read, by gRPC code (others: 502).
STATUS_BY_CODE = {"NOT_FOUND": 404, "PERMISSION_DENIED": 403, "INVALID_ARGUMENT": 400}
# Every gRPC call of the console: pages wait this long at most.
CALL_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class ConsoleSettings:
    server: str
    root_certificates: Pem | None = None
    client_certificate: Pem | None = None
    client_key: Pem | None = None
    # Mark the cookie Secure although the console itself speaks HTTP (TLS ends in a proxy).
    secure_cookies: bool = False
    session_limits: SessionLimits = field(default_factory=SessionLimits)
    call_timeout_seconds: float = CALL_TIMEOUT_SECONDS

    def ledger(self, token: str) -> AsyncLedger:
        return AsyncLedger(
            self.server,
            token,
            root_certificates=self.root_certificates,
            client_certificate=self.client_certificate,
            client_key=self.client_key,
            timeout_seconds=self.call_timeout_seconds,
        )


class SecurityHeaders:
    """Adds the security headers (the CSP above all) to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


# --- rendering --------------------------------------------------------------------------------


def _timestamp(value: Any) -> str:
    if value is None or (value.seconds == 0 and value.nanos == 0):
        return ""
    return value.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty_json(value: bytes | str) -> str:
    if not value:
        return ""
    try:
        return json.dumps(json.loads(value), indent=2, ensure_ascii=False, sort_keys=True)
    except ValueError:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _percent(part: int, whole: int) -> str:
    if whole <= 0:
        return "0"
    return f"{max(0.0, min(100.0, 100.0 * part / whole)):.2f}"


def make_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    environment = templates.env
    environment.filters.update(
        timestamp=_timestamp,
        pretty_json=_pretty_json,
        text=_text,
        stage=lambda value: common_pb2.Stage.Name(value),
        outcome=lambda value: common_pb2.Outcome.Name(value),
        approval_state=lambda value: approvals_pb2.ApprovalState.Name(value),
        budget_scope=lambda value: budgets_pb2.BudgetScope.Name(value),
        percent=_percent,
    )
    return templates


# --- sessions, CSRF, errors -------------------------------------------------------------------


class Console:
    """The console's state: settings, templates, the session table."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.templates = make_templates()
        self.sessions = SessionTable(settings.session_limits)

    def session_of(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(self.cookie_name(request)))

    def cookie_name(self, request: Request) -> str:
        return COOKIE_NAME_SECURE if self.secure(request) else COOKIE_NAME

    def secure(self, request: Request) -> bool:
        return self.settings.secure_cookies or request.url.scheme == "https"

    def set_cookie(self, request: Request, response: Response, session: Session) -> None:
        response.set_cookie(
            self.cookie_name(request),
            session.session_id,
            httponly=True,
            samesite="strict",
            secure=self.secure(request),
            path="/",
        )

    def clear_cookie(self, request: Request, response: Response) -> None:
        response.delete_cookie(
            self.cookie_name(request), httponly=True, samesite="strict", secure=self.secure(request), path="/"
        )

    def render(
        self,
        request: Request,
        name: str,
        session: Session | None,
        status_code: int = 200,
        *,
        fragment: bool = False,
        **context: Any,
    ) -> HTMLResponse:
        """A page (which shows, and so takes, the session's messages) or a fragment of one."""
        context.update(
            session=session,
            csrf_token=session.csrf_token if session else "",
            flashes=session.take_flashes() if session and not fragment else [],
            server=self.settings.server,
            path=request.url.path,
        )
        return self.templates.TemplateResponse(request, name, context, status_code=status_code)

    async def close_dropped(self) -> None:
        for session in self.sessions.take_dropped():
            if session.ledger is not None:
                await session.ledger.close()
                session.ledger = None


Handler = Callable[[Console, Request, Session], Awaitable[Response]]


def page(console: Console, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A page for signed-in sessions: others go to the sign-in page. A token the gate no longer
    accepts ends the session; another refusal of a read is shown as the page."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        session = console.session_of(request)
        if session is None or not session.signed_in:
            if request.headers.get("hx-request") == "true":  # htmx: leave the page, not the fragment
                return Response(status_code=204, headers={"HX-Redirect": "/sign-in"})
            return RedirectResponse("/sign-in", status_code=303)
        try:
            return await handler(console, request, session)
        except Unauthenticated:
            console.sessions.end(session)
            response = RedirectResponse("/sign-in?expired=1", status_code=303)
            console.clear_cookie(request, response)
            return response
        except LedgerError as error:
            status_code = STATUS_BY_CODE.get(error.code.name, 502)
            return console.render(request, "error.html", session, status_code=status_code, error=error)
        finally:
            await console.close_dropped()

    return endpoint


def action(console: Console, handler: Callable[[Console, Request, Session, FormData], Awaitable[Response]]):
    """A POST from a signed-in session carrying the session's CSRF token, or a 403."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        session = console.session_of(request)
        form = await request.form(max_files=0, max_fields=32, max_part_size=FORM_FIELD_LENGTH_MAX)
        if session is None or not session.csrf_matches(field_text(form, "csrf_token")):
            return refused_csrf()
        if not session.signed_in:
            return RedirectResponse("/sign-in", status_code=303)
        try:
            return await handler(console, request, session, form)
        except Unauthenticated:
            console.sessions.end(session)
            response = RedirectResponse("/sign-in?expired=1", status_code=303)
            console.clear_cookie(request, response)
            return response
        finally:
            await console.close_dropped()

    return endpoint


def refused_csrf() -> Response:
    return HTMLResponse(
        "<!doctype html><html lang=en><title>Refused</title><main><h1>Refused</h1>"
        "<p>The form did not carry this session's CSRF token. Reload the page and try again.</p></main>",
        status_code=403,
    )


def field_text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def refusal_text(error: LedgerError) -> str:
    """A refusal as a reviewer reads it: the reason code, then the server's words."""
    return f"{error.reason}: {error.message}"
