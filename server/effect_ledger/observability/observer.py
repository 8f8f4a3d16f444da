"""What the guard reports when a call ends: one access line, and the call's metrics.

The access line (logger ``effect_ledger.access``, INFO) has the method, the request id, the
caller's tenant and principal (when its token checked out), the status code name, the error's
reason, the duration in milliseconds, and for a call that produced a decision its id, outcome
and reason codes. With logging above INFO and metrics off, a call costs one level check here.
"""

from __future__ import annotations

import logging
from typing import Any

from effect_ledger.observability import logs
from effect_ledger.observability.calls import CallState
from effect_ledger.observability.metrics import Metrics
from effectledger.v1 import common_pb2

# The calls whose response is a decision (decision_id, outcome, reasons).
DECISION_METHODS = frozenset({"effectledger.v1.Gate/AuthorizeEffect"})


def decision_of(state: CallState) -> tuple[str, str, list[str]] | None:
    """(decision id, outcome, reason codes in the answer's order) of a call that produced a
    decision."""
    response = state.response
    if response is None or state.method not in DECISION_METHODS or not response.decision_id:
        return None
    return (
        response.decision_id,
        common_pb2.Outcome.Name(response.outcome),
        [reason.code for reason in response.reasons],
    )


class Observer:
    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self._access_level = logging.getLogger(logs.ACCESS_LOGGER)
        self._access: Any = logs.get_logger(logs.ACCESS_LOGGER)

    def finish(self, state: CallState, seconds: float) -> None:
        logging_access = self._access_level.isEnabledFor(logging.INFO)
        if self.metrics is None and not logging_access:
            return
        decision = decision_of(state)
        if self.metrics is not None:
            self.metrics.observe_call(state.method, state.code, seconds)
            if decision is not None:
                codes = decision[2]
                self.metrics.observe_decision(decision[1], codes[0] if codes else "")
        if logging_access:
            fields: dict[str, Any] = {
                "method": state.method,
                "code": state.code,
                "duration_ms": round(seconds * 1000, 3),
                "request_id": state.request_id,
                "tenant": state.tenant_id,
                "principal": state.caller_id,
            }
            if state.reason:
                fields["reason"] = state.reason
            if decision is not None:
                fields["decision_id"], fields["outcome"] = decision[0], decision[1]
                if decision[2]:
                    # The decision's reason codes; ``reason`` stays the error's, as on every call.
                    fields["reasons"] = decision[2]
            if state.trace_id:
                fields["trace_id"] = state.trace_id
            self._access.info("rpc", **fields)
