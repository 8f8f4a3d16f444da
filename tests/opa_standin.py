"""A stand-in for an OPA server, for tests of the remote policy adapter (``--opa-url``).

The OPA binary cannot be installed on the machines these tests run on, so this small HTTP
server speaks the parts of OPA's REST API that ``effect_ledger.policy.remote`` uses:

* ``POST /v1/data/<package path>/<rule>`` with ``{"input": ...}`` answers ``{"result": value}``,
  or ``{}`` when the value is undefined (as OPA does);
* ``GET /v1/policies`` answers ``{"result": [{"id", "raw", "ast"}, ...]}``;
* ``GET /v1/policies/<id>`` answers ``{"result": {"id", "raw", "ast"}}`` (404 when unknown).

In its normal mode it really evaluates the policy: every non-test ``.rego`` file under the
policy folder is loaded into the embedded Rego engine ``regorus`` (the same engine the service
embeds, which agrees with OPA on this policy), and each policy's id is its path relative to the
folder, the name the embedded engine uses, so both report the same policy revision.

Fault modes, settable while it runs (``set_mode``):

* ``"normal"``    evaluate and answer like OPA;
* ``"http500"``   every endpoint answers 500 with an OPA-style error body;
* ``"slow"``      every endpoint waits ``slow_seconds`` (longer than the client's timeout), then
                  answers normally: a late answer, possibly an ALLOW, that must not count;
* ``"no_result"`` the decision endpoint answers 200 with ``{}`` (undefined decision);
* ``"malformed"`` the decision endpoint answers 200 with ``{"result": <value>}`` where the value
                  is not a valid decision (``set_mode("malformed", result=...)``; default
                  ``{"outcome": "MAYBE"}``);
* ``"stopped"``   the listening socket is closed (connection refused); leaving this mode binds
                  the same port again.

``no_result`` and ``malformed`` touch only the decision endpoint: ``/v1/policies`` keeps
answering, like an OPA whose policy is loaded but gives no valid decision.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import regorus

MODES = ("normal", "http500", "slow", "no_result", "malformed", "stopped")
DEFAULT_MALFORMED_RESULT: Any = {"outcome": "MAYBE"}


def load_policies(policy_dir: Path) -> dict[str, str]:
    """The policy texts by id: each non-test .rego file, named by its path under the folder."""
    files = sorted(p for p in policy_dir.rglob("*.rego") if not p.name.endswith("_test.rego"))
    if not files:
        raise ValueError(f"no .rego policy files under {policy_dir}")
    return {p.relative_to(policy_dir).as_posix(): p.read_text(encoding="utf-8") for p in files}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class OpaStandIn:
    """An OPA-like HTTP server on 127.0.0.1 and an ephemeral port, served by a background thread."""

    def __init__(self, policy_dir: Path, *, slow_seconds: float = 2.0) -> None:
        self.policies = load_policies(policy_dir)
        self.slow_seconds = slow_seconds
        self.port = 0
        self.requests: Counter[str] = Counter()  # "POST decision", "GET policies", "GET policy"
        self._mode = "normal"
        self._malformed_result: Any = DEFAULT_MALFORMED_RESULT
        self._lock = threading.Lock()  # guards the counters
        self._new_engine()  # parse once now, so a broken policy fails here rather than per request
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    def start(self) -> OpaStandIn:
        if self._server is not None:
            return self
        handler = _handler_for(self)
        deadline = time.monotonic() + 5.0
        while True:
            try:
                server = _Server(("127.0.0.1", self.port), handler)
                break
            except OSError:
                # Binding the same port again right after closing it: retry briefly.
                if not self.port or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def set_mode(self, mode: str, *, result: Any = DEFAULT_MALFORMED_RESULT) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
        self._malformed_result = result
        self._mode = mode
        if mode == "stopped":
            self.stop()
        else:
            self.start()

    def __enter__(self) -> OpaStandIn:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # --- what it answers -----------------------------------------------------------------------

    def count(self, kind: str | None = None) -> int:
        """Requests received of one kind, or of every kind."""
        with self._lock:
            return self.requests[kind] if kind else sum(self.requests.values())

    def _note(self, kind: str) -> None:
        with self._lock:
            self.requests[kind] += 1

    def _new_engine(self) -> regorus.Engine:
        engine = regorus.Engine()
        for policy_id, text in self.policies.items():
            engine.add_policy(policy_id, text)
        return engine

    def evaluate(self, query_path: str, input_value: Any) -> tuple[int, dict[str, Any]]:
        """OPA's answer to POST /v1/data/<query_path>: (status, body)."""
        query = "data." + query_path.strip("/").replace("/", ".")
        try:
            # A regorus Engine may only be used by the thread that made it; each request has
            # its own thread, so each evaluation gets its own engine (the policy is small).
            engine = self._new_engine()
            engine.set_input_json(json.dumps(input_value))
            value = engine.eval_rule(query)
        except RuntimeError as error:
            if str(error).startswith("not a valid rule path"):
                return 200, {}  # OPA: an undefined document has no "result"
            return 500, {"code": "internal_error", "message": str(error).splitlines()[0]}
        return 200, ({} if value is None else {"result": value})

    def _policy(self, policy_id: str) -> dict[str, Any]:
        return {"id": policy_id, "raw": self.policies[policy_id], "ast": {}}

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """The (status, body) for one request, in the current mode."""
        mode = self._mode
        if method == "POST" and path.startswith("/v1/data/"):
            kind = "POST decision"
        elif method == "GET" and path.rstrip("/") == "/v1/policies":
            kind = "GET policies"
        elif method == "GET" and path.startswith("/v1/policies/"):
            kind = "GET policy"
        else:
            return 404, {"code": "resource_not_found", "message": f"no route {method} {path}"}
        self._note(kind)
        if mode == "slow":
            deadline = time.monotonic() + self.slow_seconds
            while time.monotonic() < deadline and self._mode == "slow":
                time.sleep(0.01)
        if mode == "http500":
            return 500, {"code": "internal_error", "message": "stand-in fault: http500"}
        if kind == "POST decision":
            try:
                document = json.loads(body or b"{}")
            except ValueError:
                return 400, {"code": "invalid_parameter", "message": "body is not JSON"}
            if mode == "no_result":
                return 200, {}
            if mode == "malformed":
                return 200, {"result": self._malformed_result}
            return self.evaluate(path[len("/v1/data/") :], document.get("input"))
        if kind == "GET policies":
            return 200, {"result": [self._policy(policy_id) for policy_id in sorted(self.policies)]}
        policy_id = unquote(path[len("/v1/policies/") :])
        if policy_id not in self.policies:
            return 404, {"code": "resource_not_found", "message": f"storage_not_found_error: policy id {policy_id!r}"}
        return 200, {"result": self._policy(policy_id)}


def _handler_for(standin: OpaStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: nothing pooled survives a stop

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, document = standin.answer(method, urlparse(self.path).path, body)
            payload = json.dumps(document).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): a late answer goes nowhere

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, *_args: Any) -> None:
            pass

    return Handler
