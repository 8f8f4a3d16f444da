"""The policy engine, observed: each evaluation timed, its failures counted, and traced.

``observed`` wraps an engine only when metrics or traces are on; otherwise it returns the engine
itself, so an evaluation costs nothing more. Failures are not logged here: the guard logs each
failed call's cause once, with its request id.
"""

from __future__ import annotations

import time
from typing import Any

from effect_ledger.errors import PolicyUnavailable
from effect_ledger.observability import tracing
from effect_ledger.observability.metrics import Metrics
from effect_ledger.policy.engine import DECISION_PACKAGE, PolicyDecision, PolicyEngine


class ObservedPolicyEngine:
    def __init__(self, inner: PolicyEngine, metrics: Metrics | None) -> None:
        self.inner = inner
        self.name = inner.name
        self.metrics = metrics

    async def evaluate(
        self, policy_input: dict[str, Any], input_json: bytes | None = None, package: str = DECISION_PACKAGE
    ) -> PolicyDecision:
        started = time.perf_counter()
        attributes = {"effect_ledger.policy.engine": self.name, "effect_ledger.policy.package": package}
        with tracing.span(tracing.POLICY_SPAN, attributes) as span:
            try:
                decision = await self.inner.evaluate(policy_input, input_json, package)
            except PolicyUnavailable as error:
                if self.metrics is not None:
                    self.metrics.policy_errors.labels(self.name, error.reason).inc()
                raise
            finally:
                if self.metrics is not None:
                    self.metrics.policy_seconds.labels(self.name, package).observe(time.perf_counter() - started)
            if span is not None:
                span.set_attribute("effect_ledger.policy.outcome", decision.outcome.value)
            return decision

    async def revision(self) -> str:
        return await self.inner.revision()

    async def close(self) -> None:
        await self.inner.close()


def observed(engine: PolicyEngine, metrics: Metrics | None) -> PolicyEngine:
    if metrics is None and not tracing.enabled():
        return engine
    return ObservedPolicyEngine(engine, metrics)
