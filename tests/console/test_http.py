"""The console's HTTP surface without a browser: CSRF, cookie flags (over HTTP, behind a proxy
and under the console's own TLS), the CSP, a refused token."""

from __future__ import annotations

import httpx
import pytest

from console.conftest import ConsoleProcess, csrf_token_of, sign_in_http
from effect_ledger_client.proto import runs_pb2


@pytest.fixture
def http(console):
    with httpx.Client(base_url=console.url, timeout=10.0) as client:
        yield client


def test_a_bad_token_is_refused_and_signs_nobody_in(http):
    response = sign_in_http(http, "elt_not-a-token-the-gate-knows")
    assert response.status_code == 401
    assert "The gate refused that token (" in response.text, response.text
    assert http.get("/approvals").headers["location"] == "/sign-in"
    assert http.get("/approvals/events").status_code == 401
    fragment = http.get("/approvals/fragment", headers={"HX-Request": "true"})
    assert fragment.status_code == 204 and fragment.headers["hx-redirect"] == "/sign-in"


def test_the_cookie_holds_a_random_session_id_not_the_token(http, tenant):
    token = tenant.tokens["reviewer"]
    anonymous = http.get("/sign-in")
    cookie = anonymous.headers["set-cookie"]
    assert cookie.startswith("effect_ledger_console=")
    assert all(flag in cookie.lower() for flag in ("httponly", "samesite=strict", "path=/"))
    assert "secure" not in cookie.lower()  # plain HTTP: a Secure cookie would never come back

    response = sign_in_http(http, token)
    assert response.status_code == 303 and response.headers["location"] == "/approvals"
    signed = response.headers["set-cookie"]
    assert all(flag in signed.lower() for flag in ("httponly", "samesite=strict"))
    session_id = http.cookies["effect_ledger_console"]
    assert token not in signed and len(session_id) >= 40
    assert session_id not in cookie  # signing in gives a fresh session id
    page = http.get("/approvals")
    assert page.status_code == 200 and token not in page.text

    http.post("/sign-out", data={"csrf_token": csrf_token_of(page.text)})
    assert http.get("/approvals").headers["location"] == "/sign-in"


def test_posts_without_the_sessions_csrf_token_are_refused(http, tenant, ledgers):
    run_id = ledgers["agent"].runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
    assert http.post("/sign-in", data={"token": tenant.tokens["reviewer"]}).status_code == 403
    assert sign_in_http(http, tenant.tokens["admin"]).status_code == 303
    token = csrf_token_of(http.get("/approvals").text)

    for data in ({}, {"csrf_token": ""}, {"csrf_token": token[:-1] + ("A" if token[-1] != "A" else "B")}):
        decide = http.post("/approvals/apr_x/decide", data={**data, "verdict": "approve", "comment": "yes"})
        reconcile = http.post(
            "/effects/eff_x/reconcile", data={**data, "evidence": "receipt", "provider_reference": "r"}
        )
        sign_out = http.post("/sign-out", data=data)
        assert (decide.status_code, reconcile.status_code, sign_out.status_code) == (403, 403, 403)
    # Another visitor's token does not fit this session either.
    with httpx.Client(base_url=str(http.base_url)) as other:
        foreign = csrf_token_of(other.get("/sign-in").text)
    assert http.post("/sign-out", data={"csrf_token": foreign}).status_code == 403

    # With the token the request reaches the gate, whose answer is shown.
    answered = http.post(
        "/approvals/apr_x/decide",
        data={"csrf_token": token, "verdict": "approve", "comment": "checked"},
        follow_redirects=True,
    )
    assert "The gate refused to approve apr_x: " in answered.text and "not found" in answered.text
    no_reason = http.post(
        "/approvals/apr_x/decide", data={"csrf_token": token, "verdict": "deny"}, follow_redirects=True
    )
    assert "A reason is required" in no_reason.text
    assert run_id in http.get("/runs").text


def test_every_response_carries_the_content_security_policy(http, tenant):
    sign_in_http(http, tenant.tokens["auditor"])
    for path in (
        "/approvals",
        "/approvals/fragment",
        "/runs",
        "/effects",
        "/budgets",
        "/runs/run_missing",
        "/static/htmx.min.js",
        "/static/console.css",
    ):
        response = http.get(path)
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy, path
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy, path
        assert response.headers["x-content-type-options"] == "nosniff", path
    assert "<script>" not in http.get("/approvals").text  # no inline script to allow


def test_cookies_are_secure_when_the_console_is_behind_tls(server, tenant):
    console = ConsoleProcess(server.target, ("--secure-cookies",)).start()
    try:
        with httpx.Client(base_url=console.url, timeout=10.0) as client:
            cookie = client.get("/sign-in").headers["set-cookie"]
            assert cookie.startswith("__Host-effect_ledger_console=")
            assert all(flag in cookie.lower() for flag in ("secure", "httponly", "samesite=strict", "path=/"))
    finally:
        console.stop()


def test_cookies_are_secure_when_the_console_serves_tls_itself(server, tenant, tmp_path):
    from e2e.test_tls import make_pki

    pki = make_pki(tmp_path)
    console = ConsoleProcess(
        server.target,
        ("--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server-key.pem")),
        tls_ca=pki.path("ca.pem"),
    ).start()
    try:
        assert console.url.startswith("https://")
        with httpx.Client(base_url=console.url, timeout=10.0, verify=console.verify) as client:
            for response in (client.get("/sign-in"), sign_in_http(client, tenant.tokens["reviewer"])):
                cookie = response.headers["set-cookie"]
                name, _, attributes = cookie.partition(";")
                assert name.startswith("__Host-effect_ledger_console="), cookie
                flags = {flag.strip().lower() for flag in attributes.split(";")}
                assert {"secure", "httponly", "samesite=strict", "path=/"} <= flags, cookie
                assert not any(flag.startswith("domain") for flag in flags), cookie  # a __Host- cookie has none
            assert response.status_code == 303 and response.headers["location"] == "/approvals"
            # The Secure cookie comes back over HTTPS: the session is signed in.
            assert client.get("/approvals").status_code == 200
        # Plain HTTP to the same port is not served.
        with pytest.raises(httpx.HTTPError):
            httpx.get(console.url.replace("https://", "http://") + "/sign-in", timeout=5.0)
    finally:
        console.stop()
