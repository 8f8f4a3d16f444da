"""A real OPA server, through opa-python-client (``--opa-url``).

Deployments run OPA with ``policy/`` loaded (``deploy/compose.yaml``). Every fault fails closed:
unreachable, an HTTP error, slower than the timeout, ``200`` without ``result``, or a result
of the wrong shape gives UNAVAILABLE (POLICY_UNAVAILABLE or POLICY_UNDEFINED), never ALLOW.

The policy revision is the digest of the policies OPA reports at ``/v1/policies`` (their
ids and raw text), refreshed at most every ``revision_ttl_seconds``.

What a client is told of a fault names what failed and the exception's type, never OPA's host,
port or URL (an HTTP client's error text holds them); the full error is logged at WARNING.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import urlparse

from opa_client.opa_async import AsyncOpaClient

from effect_ledger.errors import PolicyUnavailable
from effect_ledger.policy.engine import (
    DECISION_PACKAGE,
    DECISION_RULE,
    PolicyDecision,
    parse_decision,
    revision_of,
    undefined,
)

ENGINE_NAME = "opa-remote"

log = logging.getLogger(__name__)


def _unavailable(detail: str, error: BaseException | None = None) -> PolicyUnavailable:
    """POLICY_UNAVAILABLE saying ``detail`` (no address); ``error``'s own text is only logged."""
    if error is not None:
        log.warning("the OPA server is unavailable: %s: %s: %s", detail, type(error).__name__, error)
        detail = f"{detail} ({type(error).__name__})"
    return PolicyUnavailable(
        f"the OPA server is unavailable: {detail}",
        reason="POLICY_UNAVAILABLE",
        metadata={"engine": ENGINE_NAME, "detail": detail[:200]},
    )


class RemoteOpaEngine:
    name = ENGINE_NAME

    def __init__(self, url: str, *, timeout_seconds: float = 0.5, revision_ttl_seconds: float = 5.0) -> None:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise SystemExit(f"--opa-url must be http(s)://host:port, not {url!r}")
        self.timeout_seconds = timeout_seconds
        self.revision_ttl_seconds = revision_ttl_seconds
        # retries=0: the gate answers within its own deadline; the runtime retries the RPC.
        self._client = AsyncOpaClient(
            host=parsed.hostname,
            port=parsed.port or (443 if parsed.scheme == "https" else 80),
            ssl=parsed.scheme == "https",
            retries=0,
            timeout=timeout_seconds,
        )
        self._session_ready = False
        self._revision: str | None = None
        self._revision_at = 0.0

    async def _ensure_session(self) -> None:
        if not self._session_ready:
            await self._client._init_session()  # the client's documented lazy start (__aenter__)
            self._session_ready = True

    async def _fetch_revision(self) -> str:
        ids = await self._client.get_policies_list()
        texts: dict[str, bytes] = {}
        for policy_id in ids:
            policy = await self._client.get_policy(policy_id)
            raw = (policy.get("result") or {}).get("raw", "")
            texts[policy_id] = raw.encode("utf-8")
        if not texts:
            raise undefined("the OPA server has no policies loaded")
        return revision_of(texts)

    async def revision(self) -> str:
        await self._ensure_session()
        if self._revision is None or time.monotonic() - self._revision_at > self.revision_ttl_seconds:
            try:
                self._revision = await asyncio.wait_for(self._fetch_revision(), self.timeout_seconds)
            except PolicyUnavailable:
                raise
            except Exception as error:
                raise _unavailable("policies not readable", error) from error
            self._revision_at = time.monotonic()
        return self._revision

    def reload(self) -> None:
        """SIGHUP: the policy itself lives in the OPA server (which loads its own bundles), so
        nothing is loaded here; the cached revision is dropped and read again from OPA on the
        next decision."""
        self._revision = None

    async def evaluate(
        self, policy_input: dict[str, Any], input_json: bytes | None = None, package: str = DECISION_PACKAGE
    ) -> PolicyDecision:
        revision = await self.revision()
        try:
            response = await asyncio.wait_for(
                self._client.query_rule(policy_input, package, DECISION_RULE),
                self.timeout_seconds,
            )
        except TimeoutError as error:
            raise _unavailable(f"no answer within {self.timeout_seconds} s") from error
        except Exception as error:
            raise _unavailable("the decision query failed", error) from error
        if not isinstance(response, dict):
            raise undefined("the response is not a JSON object")
        return parse_decision(response.get("result"), engine=ENGINE_NAME, revision=revision, package=package)

    async def close(self) -> None:
        await self._client.close_connection()
