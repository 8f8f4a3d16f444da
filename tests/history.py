"""Client-side histories of calls to the gate, and a checker for them, in the style of Jepsen.

A history is a list of operations, indexed in the order they were recorded. Every call appends
an ``invoke`` operation, then exactly one completion for it:

- ``ok``: the service answered; the completion holds the response fields that matter;
- ``fail``: a definite error, a status that means the service did not apply the call;
- ``info``: indeterminate (a deadline, a lost connection): the call may or may not have
  happened, now or at any later moment.

An invoke that never completed (the client stopped) counts as ``info``. Call A precedes call B
in real time when A's ``ok``/``fail`` completion was recorded before B's invoke; an ``info``
call precedes nothing.

The checker functions are pure. Each takes a history (and whatever else it needs: the tool
contracts, a final read of the effects, budget limits) and returns a list of ``Violation``s,
each naming the operations that show it. A violation is reported only when no order of the
concurrent and indeterminate calls explains the history.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from effect_ledger.domain.lifecycle import ALLOWED_EDGES
from effectledger.v1 import budgets_pb2, budgets_pb2_grpc, common_pb2, gate_pb2, gate_pb2_grpc

INF = float("inf")
SERVICE_ERROR_DOMAIN = "effect-ledger"

OPEN_STAGES = frozenset({"AUTHORIZED", "DISPATCHED", "UNKNOWN"})
NOT_APPLIED = frozenset({"FAILED", "RELEASED"})
EDGES: dict[str, frozenset[str]] = {
    source.value: frozenset(target.value for target in targets) for source, targets in ALLOWED_EDGES.items()
}

# Operation functions.
AUTHORIZE, DISPATCH, OUTCOME, RELEASE, RECONCILE = "authorize", "dispatch", "outcome", "release", "reconcile"
READ, BUDGET_READ = "read", "budget_read"
RENEW = "renew"  # RenewLease: a heartbeat; its answer shows the attempt's stage
WRITES = frozenset({AUTHORIZE, DISPATCH, OUTCOME, RELEASE, RECONCILE})


# --- the history ---------------------------------------------------------------------------


@dataclass
class Op:
    """One line of a history.

    ``outcome``: for ``authorize`` the gate's answer (ALLOW, DENY, ...); for ``outcome`` and
    ``reconcile`` what the client asserts (SUCCEEDED, FAILED, UNKNOWN); DISPATCHED or RELEASED
    for those reports. ``stage``: the stage the response shows (the attempt's for reports, the
    effect's for authorize, reconcile and reads). ``receipt``: a provider reference (sent, on
    an invoke; returned, on a completion).
    """

    index: int
    type: str  # invoke | ok | fail | info
    process: str
    f: str
    tenant: str = ""
    key: str = ""
    tool: str = ""
    digest: str = ""
    attempt_id: str = ""
    effect_id: str = ""
    outcome: str = ""
    stage: str = ""
    receipt: str = ""
    error: str = ""
    value: dict[str, Any] = field(default_factory=dict)
    invoke: int | None = None  # on a completion: the index of its invoke
    time: float = 0.0

    def __str__(self) -> str:
        parts = [f"#{self.index}", self.process, self.type, self.f]
        for name in ("key", "attempt_id", "effect_id", "digest", "outcome", "stage", "receipt", "error"):
            value = getattr(self, name)
            if value:
                parts.append(f"{name}={value[:16] if name == 'digest' else value}")
        return " ".join(parts)


IDENTITY_FIELDS = ("tenant", "key", "tool", "attempt_id", "effect_id")


class History:
    """A thread-safe, append-only history."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def _append(self, **fields: Any) -> Op:
        with self._lock:
            op = Op(index=len(self.ops), time=time.monotonic() - self._started, **fields)
            self.ops.append(op)
            return op

    def invoke(self, process: str, f: str, **fields: Any) -> Op:
        return self._append(type="invoke", process=str(process), f=f, **fields)

    def complete(self, invoke: Op, type: str, **fields: Any) -> Op:
        """The completion of ``invoke``; it keeps the invoke's identity fields unless given."""
        assert type in ("ok", "fail", "info"), type
        assert invoke.type == "invoke", invoke
        for name in IDENTITY_FIELDS:
            if not fields.get(name):
                fields[name] = getattr(invoke, name)
        if invoke.f in (DISPATCH, OUTCOME, RELEASE, RECONCILE):
            fields.setdefault("outcome", invoke.outcome)
        return self._append(type=type, process=invoke.process, f=invoke.f, invoke=invoke.index, **fields)

    def ok(self, invoke: Op, **fields: Any) -> Op:
        return self.complete(invoke, "ok", **fields)

    def fail(self, invoke: Op, **fields: Any) -> Op:
        return self.complete(invoke, "fail", **fields)

    def info(self, invoke: Op, **fields: Any) -> Op:
        return self.complete(invoke, "info", **fields)

    def __iter__(self):
        return iter(list(self.ops))

    def __len__(self) -> int:
        return len(self.ops)

    def counts(self) -> dict[str, int]:
        counted: dict[str, int] = defaultdict(int)
        for op in self.ops:
            counted[op.type] += 1
        return dict(counted)

    def format(self, last: int | None = None) -> str:
        ops = self.ops if last is None else self.ops[-last:]
        return "\n".join(str(op) for op in ops)

    def to_json_lines(self) -> str:
        return "\n".join(json.dumps(op.__dict__, default=str, sort_keys=True) for op in self.ops)


@dataclass(frozen=True)
class Call:
    """An invoke with its completion (None: the client never saw one)."""

    invoke: Op
    completion: Op | None

    @property
    def type(self) -> str:
        return self.completion.type if self.completion is not None else "info"

    @property
    def ok(self) -> bool:
        return self.type == "ok"

    @property
    def f(self) -> str:
        return self.invoke.f

    @property
    def start(self) -> float:
        return self.invoke.index

    @property
    def end(self) -> float:
        """When the call is known to have taken effect or not; never, for an ``info`` call."""
        if self.completion is None or self.completion.type == "info":
            return INF
        return self.completion.index

    @property
    def ops(self) -> tuple[Op, ...]:
        return (self.invoke,) if self.completion is None else (self.invoke, self.completion)

    def pick(self, name: str) -> Any:
        """The completion's value of a field when it has one, else the invoke's."""
        if self.completion is not None and getattr(self.completion, name):
            return getattr(self.completion, name)
        return getattr(self.invoke, name)

    @property
    def answer(self) -> Op:
        assert self.completion is not None
        return self.completion

    def precedes(self, other: Call) -> bool:
        return self.end < other.start


def calls_of(history: History | Iterable[Op]) -> list[Call]:
    ops = list(history.ops if isinstance(history, History) else history)
    completions = {op.invoke: op for op in ops if op.type != "invoke" and op.invoke is not None}
    return [Call(op, completions.get(op.index)) for op in ops if op.type == "invoke"]


# --- final reads -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FinalAttempt:
    attempt_id: str
    number: int
    stage: str
    receipt: str = ""
    dispatched: bool = False
    provider_key: str = ""


@dataclass(frozen=True)
class FinalEffect:
    """An effect as the service shows it after the run (e.g. GetEffect per effect id)."""

    effect_id: str
    tenant: str
    key: str
    tool: str
    stage: str
    intent_digest: str
    receipt: str = ""
    attempts: tuple[FinalAttempt, ...] = ()


def final_effect(tenant: str, effect: gate_pb2.Effect) -> FinalEffect:
    return FinalEffect(
        effect_id=effect.effect_id,
        tenant=tenant,
        key=effect.idempotency_key,
        tool=effect.tool,
        stage=common_pb2.Stage.Name(effect.stage),
        intent_digest=effect.intent_digest,
        receipt=effect.receipt.provider_reference if effect.HasField("receipt") else "",
        attempts=tuple(
            FinalAttempt(
                attempt_id=attempt.attempt_id,
                number=attempt.number,
                stage=common_pb2.Stage.Name(attempt.stage),
                receipt=attempt.receipt.provider_reference if attempt.HasField("receipt") else "",
                dispatched=attempt.HasField("dispatched_at") and attempt.dispatched_at.seconds > 0,
                provider_key=attempt.provider_idempotency_key,
            )
            for attempt in effect.attempts
        ),
    )


Final = Mapping[str, FinalEffect]  # effect_id -> effect


def _final_attempts(final: Final | None) -> dict[str, tuple[FinalEffect, FinalAttempt]]:
    return {a.attempt_id: (e, a) for e in (final or {}).values() for a in e.attempts}


# --- classifying errors ----------------------------------------------------------------------

DEFINITE_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
# Definite only when the service itself answered (its ErrorInfo is attached): the same codes
# also come from the transport (a dropped connection, a server that is gone).
DEFINITE_WITH_SERVICE_DETAILS = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED})


# The service's own word that a commit's outcome is unknown: it may have happened.
INDETERMINATE_REASONS = frozenset({"COMMIT_OUTCOME_UNKNOWN"})


def classify_status(code: grpc.StatusCode, from_service: bool, reason: str = "") -> str:
    """``fail`` when the status means the call was not applied, else ``info``."""
    if reason in INDETERMINATE_REASONS:
        return "info"
    if code in DEFINITE_CODES:
        return "fail"
    if code in DEFINITE_WITH_SERVICE_DETAILS and from_service:
        return "fail"
    return "info"


@dataclass(frozen=True)
class ErrorFacts:
    kind: str  # fail | info
    code: str
    reason: str
    message: str
    metadata: dict[str, str]

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"[:300]


def error_facts(error: grpc.RpcError) -> ErrorFacts:
    code = error.code()
    info = None
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # a status that contradicts the call's code: not the service's
        status = None
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                unpacked = error_details_pb2.ErrorInfo()
                detail.Unpack(unpacked)
                if unpacked.domain == SERVICE_ERROR_DOMAIN:
                    info = unpacked
    return ErrorFacts(
        kind=classify_status(code, info is not None, info.reason if info is not None else ""),
        code=code.name,
        reason=info.reason if info is not None else "",
        message=error.details() or "",
        metadata=dict(info.metadata) if info is not None else {},
    )


# --- the recorder ------------------------------------------------------------------------------

# Reconnect quickly after the server comes back (the default backoff starts at 1 s and grows).
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 400),
)


@dataclass(frozen=True)
class Result:
    op: Op
    response: Any = None
    error: ErrorFacts | None = None

    @property
    def type(self) -> str:
        return self.op.type

    @property
    def reason(self) -> str:
        return self.error.reason if self.error is not None else ""


def _stage(value: int) -> str:
    return common_pb2.Stage.Name(value)


def _attempt_fields(response: gate_pb2.AttemptResponse) -> dict[str, Any]:
    attempt = response.attempt
    return {
        "stage": _stage(attempt.stage),
        "receipt": attempt.receipt.provider_reference if attempt.HasField("receipt") else "",
        "effect_id": attempt.effect_id,
        "value": {"changed": response.changed, "effect_stage": _stage(response.effect_stage)},
    }


def _effect_fields(effect: gate_pb2.Effect) -> dict[str, Any]:
    return {
        "stage": _stage(effect.stage),
        "receipt": effect.receipt.provider_reference if effect.HasField("receipt") else "",
        "effect_id": effect.effect_id,
        "key": effect.idempotency_key,
        "digest": effect.intent_digest,
        "value": {"attempts": {a.attempt_id: _stage(a.stage) for a in effect.attempts}},
    }


class RecordingClient:
    """Gate and Budgets calls of one client process, each recorded in a shared history.

    Every method returns a ``Result``: the completion op, and the response (``ok``) or the
    error's facts (``fail``/``info``). ``tag`` fields (key, tool, effect_id) label the ops of
    calls whose request does not name them.
    """

    def __init__(
        self,
        history: History,
        process: str,
        tenant: str,
        target: str,
        token: str,
        *,
        timeout_seconds: float = 10.0,
    ) -> None:
        self.history = history
        self.process = str(process)
        self.tenant = tenant
        self.channel = grpc.insecure_channel(target, options=list(CHANNEL_OPTIONS))
        self.gate = gate_pb2_grpc.GateStub(self.channel)
        self.budgets = budgets_pb2_grpc.BudgetsStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.timeout_seconds = timeout_seconds

    def close(self) -> None:
        self.channel.close()

    def _call(
        self,
        invoke: Op,
        method: Callable[..., Any],
        request: Any,
        fields_of: Callable[[Any], dict[str, Any]],
        wait_for_ready: bool,
        timeout: float | None,
    ) -> Result:
        try:
            response = method(
                request,
                metadata=self.metadata,
                timeout=timeout or self.timeout_seconds,
                wait_for_ready=wait_for_ready,
            )
        except grpc.RpcError as error:
            facts = error_facts(error)
            op = self.history.complete(
                invoke,
                facts.kind,
                error=str(facts),
                value={"code": facts.code, "reason": facts.reason, "metadata": facts.metadata},
            )
            return Result(op, None, facts)
        return Result(self.history.ok(invoke, **fields_of(response)), response, None)

    def _invoke(self, f: str, tag: Mapping[str, str], **fields: Any) -> Op:
        labels = {name: tag[name] for name in ("key", "tool", "effect_id") if tag.get(name)}
        return self.history.invoke(self.process, f, tenant=self.tenant, **{**labels, **fields})

    def authorize(
        self,
        request: gate_pb2.AuthorizeEffectRequest,
        *,
        digest: str = "",
        estimate: Mapping[str, int] | None = None,
        wait_for_ready: bool = False,
        timeout: float | None = None,
    ) -> Result:
        """``digest``: the client's own intent digest; ``estimate``: what an ALLOW reserves."""
        invoke = self.history.invoke(
            self.process,
            AUTHORIZE,
            tenant=self.tenant,
            key=request.idempotency_key,
            tool=request.tool,
            digest=digest,
            value={"target": request.target, "estimate": dict(estimate or request.estimate)},
        )

        def fields_of(response: gate_pb2.AuthorizeEffectResponse) -> dict[str, Any]:
            return {
                "outcome": common_pb2.Outcome.Name(response.outcome),
                "effect_id": response.effect_id,
                "attempt_id": response.attempt_id,
                "digest": response.intent_digest,
                "stage": _stage(response.effect_stage),
                "receipt": response.receipt.provider_reference if response.HasField("receipt") else "",
                "value": {
                    "attempt_number": response.attempt_number,
                    "provider_key": response.provider_idempotency_key,
                    "provider_key_reused": response.provider_key_reused,
                    "reasons": [reason.code for reason in response.reasons],
                    "reservation_ids": list(response.reservation_ids),
                },
            }

        return self._call(invoke, self.gate.AuthorizeEffect, request, fields_of, wait_for_ready, timeout)

    def dispatch(
        self, attempt_id: str, *, wait_for_ready: bool = False, timeout: float | None = None, **tag: str
    ) -> Result:
        invoke = self._invoke(DISPATCH, tag, attempt_id=attempt_id, outcome="DISPATCHED")
        request = gate_pb2.RecordDispatchRequest(attempt_id=attempt_id)
        return self._call(invoke, self.gate.RecordDispatch, request, _attempt_fields, wait_for_ready, timeout)

    def outcome(
        self,
        request: gate_pb2.RecordOutcomeRequest,
        *,
        wait_for_ready: bool = False,
        timeout: float | None = None,
        **tag: str,
    ) -> Result:
        which = request.WhichOneof("outcome") or ""
        value: dict[str, Any] = {}
        receipt = ""
        if which == "succeeded":
            receipt = request.succeeded.receipt.provider_reference
            value["usage"] = dict(request.succeeded.usage)
        elif which == "failed":
            value["evidence"] = gate_pb2.FailureEvidence.Name(request.failed.evidence)
        invoke = self._invoke(
            OUTCOME, tag, attempt_id=request.attempt_id, outcome=which.upper(), receipt=receipt, value=value
        )
        return self._call(invoke, self.gate.RecordOutcome, request, _attempt_fields, wait_for_ready, timeout)

    def release(
        self,
        attempt_id: str,
        reason: str = "not needed",
        *,
        wait_for_ready: bool = False,
        timeout: float | None = None,
        **tag: str,
    ) -> Result:
        invoke = self._invoke(RELEASE, tag, attempt_id=attempt_id, outcome="RELEASED")
        request = gate_pb2.ReleaseAttemptRequest(attempt_id=attempt_id, reason=reason)
        return self._call(invoke, self.gate.ReleaseAttempt, request, _attempt_fields, wait_for_ready, timeout)

    def reconcile(
        self,
        request: gate_pb2.ReconcileEffectRequest,
        *,
        wait_for_ready: bool = False,
        timeout: float | None = None,
        **tag: str,
    ) -> Result:
        happened = request.WhichOneof("evidence") == "receipt"
        invoke = self._invoke(
            RECONCILE,
            {**tag, "effect_id": request.effect_id},
            outcome="SUCCEEDED" if happened else "FAILED",
            receipt=request.receipt.provider_reference if happened else "",
        )
        return self._call(invoke, self.gate.ReconcileEffect, request, _effect_fields, wait_for_ready, timeout)

    def renew_lease(
        self, attempt_id: str, *, wait_for_ready: bool = False, timeout: float | None = None, **tag: str
    ) -> Result:
        invoke = self._invoke(RENEW, tag, attempt_id=attempt_id)
        request = gate_pb2.RenewLeaseRequest(attempt_id=attempt_id)
        return self._call(invoke, self.gate.RenewLease, request, _attempt_fields, wait_for_ready, timeout)

    def get_effect(
        self, effect_id: str, *, wait_for_ready: bool = False, timeout: float | None = None, **tag: str
    ) -> Result:
        invoke = self._invoke(READ, {**tag, "effect_id": effect_id})
        request = gate_pb2.GetEffectRequest(effect_id=effect_id)
        return self._call(invoke, self.gate.GetEffect, request, _effect_fields, wait_for_ready, timeout)

    def list_open_effects(
        self, run_id: str, page_token: str = "", *, wait_for_ready: bool = False, timeout: float | None = None
    ) -> Result:
        invoke = self._invoke(READ, {}, value={"run_id": run_id})

        def fields_of(response: gate_pb2.ListOpenEffectsResponse) -> dict[str, Any]:
            return {
                "value": {
                    "run_id": run_id,
                    "effects": {e.effect_id: _stage(e.stage) for e in response.effects},
                    "attempts": {a.attempt_id: _stage(a.stage) for e in response.effects for a in e.attempts},
                }
            }

        request = gate_pb2.ListOpenEffectsRequest(run_id=run_id, page_token=page_token)
        return self._call(invoke, self.gate.ListOpenEffects, request, fields_of, wait_for_ready, timeout)

    def get_budget(
        self,
        scope: int = budgets_pb2.TENANT,
        scope_id: str = "",
        *,
        wait_for_ready: bool = False,
        timeout: float | None = None,
    ) -> Result:
        scope_name = budgets_pb2.BudgetScope.Name(scope)
        invoke = self._invoke(BUDGET_READ, {}, value={"scope": scope_name, "scope_id": scope_id})

        def fields_of(response: budgets_pb2.GetBudgetResponse) -> dict[str, Any]:
            return {
                "value": {
                    "budgets": [
                        {
                            "budget_id": b.budget_id,
                            "dimension": b.dimension,
                            "limit": b.limit,
                            "posted": b.posted,
                            "pending": b.pending,
                        }
                        for b in response.budgets
                    ],
                    "open_reservations": [
                        {"attempt_id": r.attempt_id, "dimension": r.dimension, "amount": r.amount}
                        for r in response.open_reservations
                    ],
                }
            }

        request = budgets_pb2.GetBudgetRequest(scope=scope, scope_id=scope_id)
        return self._call(invoke, self.budgets.GetBudget, request, fields_of, wait_for_ready, timeout)


# --- the checker -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    property: str
    message: str
    ops: tuple[Op, ...] = ()

    def __str__(self) -> str:
        shown = "\n    ".join(str(op) for op in self.ops)
        return f"[{self.property}] {self.message}" + (f"\n    {shown}" if shown else "")

    @property
    def indices(self) -> set[int]:
        return {op.index for op in self.ops}


KeyId = tuple[str, str]  # (tenant, idempotency key)


class _Index:
    """What every check needs: calls, ALLOWs, and which key each attempt and effect belongs to."""

    def __init__(self, history: History | Iterable[Op]) -> None:
        self.calls = calls_of(history)
        self.allows = [
            c for c in self.calls if c.f == AUTHORIZE and c.ok and c.answer.outcome == "ALLOW" and c.answer.attempt_id
        ]
        self.allow_of: dict[str, Call] = {c.answer.attempt_id: c for c in self.allows}
        self.key_of_effect: dict[tuple[str, str], KeyId] = {}
        for call in self.calls:
            effect_id, key = call.pick("effect_id"), call.pick("key")
            if effect_id and key:
                self.key_of_effect.setdefault((call.invoke.tenant, effect_id), (call.invoke.tenant, key))

    def key(self, call: Call) -> KeyId | None:
        tenant = call.invoke.tenant
        if call.pick("key"):
            return (tenant, call.pick("key"))
        attempt_id = call.invoke.attempt_id
        if attempt_id in self.allow_of:
            return self.key(self.allow_of[attempt_id])
        return self.key_of_effect.get((tenant, call.pick("effect_id")))

    def by_key(self, calls: Iterable[Call]) -> dict[KeyId, list[Call]]:
        grouped: dict[KeyId, list[Call]] = defaultdict(list)
        for call in calls:
            key = self.key(call)
            if key is not None:
                grouped[key].append(call)
        return grouped


def _retry_same_key_tools(contracts: Mapping[str, Collection[str]]) -> set[str]:
    """``contracts``: tool -> its allowed recovery names."""
    return {tool for tool, recovery in contracts.items() if "RETRY_SAME_KEY" in recovery}


def _acknowledges_success(call: Call) -> bool:
    if not call.ok:
        return False
    if call.f == AUTHORIZE:
        return call.answer.outcome == "DUPLICATE"
    return call.f in (OUTCOME, RECONCILE, READ) and call.answer.stage == "SUCCEEDED"


def check_no_allow_after_success(history: History | Iterable[Op]) -> list[Violation]:
    """Per key: once a call acknowledged the effect SUCCEEDED, no later call gets ALLOW."""
    index = _Index(history)
    successes = index.by_key(c for c in index.calls if _acknowledges_success(c))
    violations = []
    for allow in index.allows:
        key = index.key(allow)
        earlier = [s for s in successes.get(key, []) if s.precedes(allow)] if key else []
        if earlier:
            first = min(earlier, key=lambda c: c.end)
            violations.append(
                Violation(
                    "no_allow_after_success",
                    f"key {key[1]!r}: ALLOW (attempt {allow.answer.attempt_id}) after the effect was "
                    f"acknowledged SUCCEEDED",
                    first.ops + allow.ops,
                )
            )
    return violations


def _not_applied_evidence(index: _Index, earlier: Call, later: Call, final_stages: Mapping[str, str]) -> Call | None:
    """A call, invoked before ``later`` was answered, that may have settled ``earlier``'s
    attempt as definitely not applied (FAILED, reconciled not_happened, RELEASED)."""
    attempt_id, effect_id = earlier.answer.attempt_id, earlier.answer.effect_id
    for call in index.calls:
        if call.type == "fail" or call.start > later.end:
            continue
        inv = call.invoke
        if (
            call.f == OUTCOME
            and inv.outcome == "FAILED"
            and inv.attempt_id == attempt_id
            or call.f == RELEASE
            and inv.attempt_id == attempt_id
        ):
            shown = call.answer.stage if call.ok else None
        elif call.f == RECONCILE and inv.outcome == "FAILED" and call.pick("effect_id") == effect_id:
            if call.ok:
                attempts = call.answer.value.get("attempts")
                shown = attempts.get(attempt_id) if attempts is not None else call.answer.stage
            else:
                shown = None
        else:
            continue
        if call.ok:
            if shown in NOT_APPLIED:
                return call
        elif final_stages.get(attempt_id, "FAILED") in NOT_APPLIED:
            # Indeterminate: it may have happened, unless the final read shows it never did.
            return call
    return None


def check_single_live_attempt(
    history: History | Iterable[Op],
    contracts: Mapping[str, Collection[str]],
    final: Final | None = None,
) -> list[Violation]:
    """Per key: two ALLOWed attempts may both take effect only under RETRY_SAME_KEY.

    For two acknowledged ALLOWs A and B of one key, one of them must have been settled as
    definitely not applied (acknowledged FAILED, reconciled not_happened, or RELEASED) by a call
    invoked before the other was answered. An indeterminate settling call counts unless the
    final read shows that the attempt was never settled so.

    With a final read, attempts whose ALLOW the history never saw (its answer was lost) count
    too: FAILED and RELEASED are terminal, so an attempt created before B (a lower number) that
    does not end FAILED or RELEASED was live when B was ALLOWed.
    """
    index = _Index(history)
    same_key_tools = _retry_same_key_tools(contracts)
    final_attempts = _final_attempts(final)
    final_stages = {attempt_id: a.stage for attempt_id, (_e, a) in final_attempts.items()}
    violations = []
    reported: set[frozenset[str]] = set()

    def report(first: str, second: str, message: str, ops: tuple[Op, ...]) -> None:
        pair = frozenset((first, second))
        if pair not in reported:
            reported.add(pair)
            violations.append(Violation("single_live_attempt", message, ops))

    for later in index.allows:
        found = final_attempts.get(later.answer.attempt_id)
        if found is None or later.invoke.tool in same_key_tools:
            continue
        effect, allowed = found
        for earlier in effect.attempts:
            if earlier.number < allowed.number and earlier.stage not in NOT_APPLIED:
                known = index.allow_of.get(earlier.attempt_id)
                report(
                    earlier.attempt_id,
                    allowed.attempt_id,
                    f"key {effect.key!r}: attempt {allowed.attempt_id} (number {allowed.number}) ALLOWed "
                    f"while attempt {earlier.attempt_id} (number {earlier.number}) was live: it ends "
                    f"{earlier.stage}",
                    (known.ops if known else ()) + later.ops,
                )
    for key, allows in index.by_key(index.allows).items():
        allows.sort(key=lambda c: c.end)
        for position, second in enumerate(allows):
            if second.invoke.tool in same_key_tools:
                continue
            for first in allows[:position]:
                if _not_applied_evidence(index, first, second, final_stages) is not None:
                    continue
                if _not_applied_evidence(index, second, first, final_stages) is not None:
                    continue  # answered later, created earlier, and settled before the other
                report(
                    first.answer.attempt_id,
                    second.answer.attempt_id,
                    f"key {key[1]!r}: attempts {first.answer.attempt_id} and {second.answer.attempt_id} were "
                    f"both ALLOWed, and neither was settled as not applied before the other was answered",
                    first.ops + second.ops,
                )
    return violations


def check_final_attempts(
    final: Final, contracts: Mapping[str, Collection[str]], history: History | Iterable[Op] = ()
) -> list[Violation]:
    """No effect ends with two attempts that may both have happened (unless RETRY_SAME_KEY)."""
    same_key_tools = _retry_same_key_tools(contracts)
    allow_of = _Index(history).allow_of
    violations = []
    for effect in final.values():
        if effect.tool in same_key_tools:
            continue
        live = [a for a in effect.attempts if a.stage not in NOT_APPLIED]
        if len(live) > 1:
            ops = tuple(op for a in live if a.attempt_id in allow_of for op in allow_of[a.attempt_id].ops)
            violations.append(
                Violation(
                    "single_live_attempt",
                    f"key {effect.key!r}: effect {effect.effect_id} ends with attempts "
                    f"{[(a.attempt_id, a.stage) for a in live]} that may all have happened",
                    ops,
                )
            )
    return violations


def check_intent_binding(history: History | Iterable[Op], final: Final | None = None) -> list[Violation]:
    """A key is bound to one intent: an ALLOW for another digest never happens.

    The bound digest is the final read's (when given), else the first acknowledged ALLOW's.
    Every ALLOW's request digest must equal it, and every answer must be for the digest asked.
    """
    index = _Index(history)
    bound_by_final = {(e.tenant, e.key): e.intent_digest for e in (final or {}).values()}
    authorizes = index.by_key(c for c in index.calls if c.f == AUTHORIZE and c.ok)
    violations = []
    for key, calls in authorizes.items():
        calls.sort(key=lambda c: c.end)
        for call in calls:
            asked, answered = call.invoke.digest, call.answer.digest
            if asked and answered and asked != answered:
                violations.append(
                    Violation(
                        "intent_binding",
                        f"key {key[1]!r}: asked for digest {asked[:12]}, answered for {answered[:12]}",
                        call.ops,
                    )
                )
        allows = [c for c in calls if c.answer.outcome == "ALLOW"]
        if not allows:
            continue
        binder = allows[0]
        bound = bound_by_final.get(key) or binder.invoke.digest or binder.answer.digest
        for call in allows:
            requested = call.invoke.digest or call.answer.digest
            if requested != bound:
                shown = call.ops if call is binder else binder.ops + call.ops
                violations.append(
                    Violation(
                        "intent_binding",
                        f"key {key[1]!r} is bound to digest {bound[:12]}: ALLOW for digest {requested[:12]}",
                        shown,
                    )
                )
    return violations


def check_receipts(history: History | Iterable[Op], final: Final | None = None) -> list[Violation]:
    """Every receipt belongs to an ALLOWed attempt of its key, and was sent by a client for it.

    An attempt id the history never saw ALLOWed is explained only by an indeterminate
    AuthorizeEffect of the same key (an ALLOW whose answer was lost), one per such call.
    """
    index = _Index(history)
    allowed = set(index.allow_of)
    lost_allows: dict[KeyId, int] = defaultdict(int)
    submitted: dict[KeyId, dict[str, list[Call]]] = defaultdict(lambda: defaultdict(list))
    for call in index.calls:
        key = index.key(call)
        if key is None:
            continue
        if call.f == AUTHORIZE and call.type == "info":
            lost_allows[key] += 1
        if call.f in (OUTCOME, RECONCILE) and call.invoke.outcome == "SUCCEEDED" and call.invoke.receipt:
            if call.type != "fail":
                submitted[key][call.invoke.receipt].append(call)
    violations = []
    unexplained: dict[KeyId, dict[str, tuple[Op, ...]]] = defaultdict(dict)

    def observe(key: KeyId | None, reference: str, attempt_id: str, ops: tuple[Op, ...], before: float) -> None:
        if key is None or not reference:
            return
        senders = [c for c in submitted[key].get(reference, []) if c.start < before]
        if not senders:
            violations.append(
                Violation("receipts", f"key {key[1]!r}: receipt {reference!r} that no client sent for this key", ops)
            )
        if attempt_id and attempt_id not in allowed:
            unexplained[key].setdefault(attempt_id, ops)

    for call in index.calls:
        if not call.ok:
            continue
        key = index.key(call)
        if call.f == OUTCOME:
            if call.invoke.attempt_id not in allowed:
                unexplained[key or ("", "")].setdefault(call.invoke.attempt_id, call.ops)
            observe(key, call.answer.receipt, call.invoke.attempt_id, call.ops, call.end)
        elif call.f in (AUTHORIZE, RECONCILE, READ):
            observe(key, call.answer.receipt, "", call.ops, call.end)
    for effect in (final or {}).values():
        key = (effect.tenant, effect.key)
        observe(key, effect.receipt, "", (), INF)
        for attempt in effect.attempts:
            if attempt.receipt:
                observe(key, attempt.receipt, attempt.attempt_id, (), INF)
    for key, attempts in unexplained.items():
        if len(attempts) > lost_allows.get(key, 0):
            for attempt_id, ops in attempts.items():
                violations.append(
                    Violation(
                        "receipts",
                        f"key {key[1]!r}: attempt {attempt_id} carries an outcome or receipt but was never "
                        f"ALLOWed ({lost_allows.get(key, 0)} indeterminate AuthorizeEffect call(s) could explain "
                        f"{len(attempts)} such attempt(s))",
                        ops,
                    )
                )
    return violations


def check_budget_samples(history: History | Iterable[Op]) -> list[Violation]:
    """posted + pending <= limit in every budget read."""
    violations = []
    for call in calls_of(history):
        if call.f != BUDGET_READ or not call.ok:
            continue
        for budget in call.answer.value.get("budgets", []):
            if budget["posted"] + budget["pending"] > budget["limit"]:
                violations.append(
                    Violation(
                        "budget",
                        f"budget {budget['budget_id']} ({budget['dimension']}): posted {budget['posted']} + "
                        f"pending {budget['pending']} > limit {budget['limit']}",
                        call.ops,
                    )
                )
    return violations


def check_budget_model(
    history: History | Iterable[Op], limits: Mapping[str, int], tenant: str | None = None
) -> list[Violation]:
    """posted + pending <= limit at every prefix, by a model replayed from the acknowledged calls.

    ``limits``: dimension -> limit of a budget (never reset) that every AuthorizeEffect of the
    history (of ``tenant``, when given) reserves in, by the estimate its invoke names.

    The model counts what must be held at a prefix, a lower bound of the true posted + pending:
    an ALLOWed attempt's estimate from an acknowledged dispatch (a dispatched reservation is
    never let go by a lease expiry) or an acknowledged, applied SUCCEEDED (posted, for good),
    until any call that may void it (FAILED, not_happened, release) was invoked. A lower bound
    over the limit is a violation in every order of the history.
    """
    index = _Index(history)
    allows = [c for c in index.allows if tenant is None or c.invoke.tenant == tenant]
    held_from: dict[str, float] = {}
    posted_from: dict[str, float] = {}
    void_from: dict[str, float] = {}
    usage_floor: dict[str, dict[str, int]] = defaultdict(dict)
    effect_attempts: dict[str, list[str]] = defaultdict(list)
    for allow in allows:
        effect_attempts[allow.answer.effect_id].append(allow.answer.attempt_id)
    for call in index.calls:
        inv = call.invoke
        targets = [inv.attempt_id] if inv.attempt_id else []
        if call.f == RECONCILE:
            targets = effect_attempts.get(call.pick("effect_id"), [])
        for attempt_id in targets:
            if attempt_id not in index.allow_of:
                continue
            allow = index.allow_of[attempt_id]
            if call.ok and call.f == DISPATCH and call.answer.stage == "DISPATCHED":
                held_from[attempt_id] = min(held_from.get(attempt_id, INF), call.end)
            if (
                call.ok
                and call.f == OUTCOME
                and inv.outcome == "SUCCEEDED"
                and call.answer.stage == "SUCCEEDED"
                and call.answer.value.get("changed", True)
            ):
                posted_from[attempt_id] = min(posted_from.get(attempt_id, INF), call.end)
            if call.f == OUTCOME and inv.outcome == "SUCCEEDED" and call.type != "fail":
                for dimension, amount in inv.value.get("usage", {}).items():
                    usage_floor[attempt_id][dimension] = min(amount, usage_floor[attempt_id].get(dimension, amount))
            # A receipt may release reservations too: under a shared provider key the money is
            # posted once, and the other attempts' reservations are voided (a reconcile receipt,
            # or a sibling's SUCCEEDED below). Counting less keeps the model a lower bound.
            voids = (
                (call.f == OUTCOME and inv.outcome == "FAILED")
                or call.f == RELEASE
                or (call.f == RECONCILE and call.end > allow.start)
            )
            if voids and call.type != "fail":
                void_from[attempt_id] = min(void_from.get(attempt_id, INF), call.start)
            if call.f == OUTCOME and inv.outcome == "SUCCEEDED" and call.type != "fail":
                for sibling in effect_attempts.get(allow.answer.effect_id, []):
                    if sibling != attempt_id:
                        void_from[sibling] = min(void_from.get(sibling, INF), call.start)
    checkpoints = sorted({c.end for c in index.calls if c.ok})
    violations = []
    for dimension, limit in limits.items():
        for point in checkpoints:
            counted = []
            total = 0
            for allow in allows:
                attempt_id = allow.answer.attempt_id
                amount = allow.invoke.value.get("estimate", {}).get(dimension, 0)
                amount = min(amount, usage_floor[attempt_id].get(dimension, amount))
                if not amount:
                    continue
                posted = posted_from.get(attempt_id, INF) <= point
                held = held_from.get(attempt_id, INF) <= point < void_from.get(attempt_id, INF)
                if posted or held:
                    counted.append(allow)
                    total += amount
            if total > limit:
                violations.append(
                    Violation(
                        "budget",
                        f"{dimension}: at least {total} posted + pending after op #{int(point)}, over the "
                        f"limit {limit}",
                        tuple(op for allow in counted for op in allow.ops),
                    )
                )
                break  # the first prefix that shows it
    return violations


def check_acknowledged_writes(history: History | Iterable[Op], final: Final) -> list[Violation]:
    """Every acknowledged write is in the final read: ALLOWed attempts exist, and no attempt
    is in a stage its acknowledged stage cannot lead to (a SUCCEEDED one keeps its receipt)."""
    index = _Index(history)
    final_attempts = _final_attempts(final)
    violations = []

    def expect(call: Call, attempt_id: str, shown: str, receipt: str = "") -> None:
        found = final_attempts.get(attempt_id)
        if found is None:
            violations.append(
                Violation("acknowledged_writes", f"attempt {attempt_id} is missing from the final read", call.ops)
            )
            return
        effect, attempt = found
        if attempt.stage != shown and attempt.stage not in EDGES.get(shown, frozenset()):
            violations.append(
                Violation(
                    "acknowledged_writes",
                    f"attempt {attempt_id} was acknowledged {shown}, but the final read shows {attempt.stage}",
                    call.ops,
                )
            )
        elif shown == "SUCCEEDED" and receipt and attempt.receipt != receipt:
            violations.append(
                Violation(
                    "acknowledged_writes",
                    f"attempt {attempt_id} was acknowledged SUCCEEDED with receipt {receipt!r}, but the final "
                    f"read shows {attempt.receipt!r}",
                    call.ops,
                )
            )

    for call in index.calls:
        if not call.ok or call.f not in WRITES:
            continue
        answer = call.answer
        if call.f == AUTHORIZE:
            if answer.outcome == "ALLOW":
                effect = final.get(answer.effect_id)
                if effect is None or effect.key != call.invoke.key:
                    violations.append(
                        Violation(
                            "acknowledged_writes",
                            f"effect {answer.effect_id} of key {call.invoke.key!r} is missing from the final read",
                            call.ops,
                        )
                    )
                    continue
                expect(call, answer.attempt_id, "AUTHORIZED")
            elif answer.outcome == "DUPLICATE":
                effect = final.get(answer.effect_id)
                if effect is None or effect.stage != "SUCCEEDED" or effect.receipt != answer.receipt:
                    violations.append(
                        Violation(
                            "acknowledged_writes",
                            f"effect {answer.effect_id} was answered DUPLICATE with receipt {answer.receipt!r}, "
                            f"the final read shows {(effect.stage, effect.receipt) if effect else 'nothing'}",
                            call.ops,
                        )
                    )
        elif call.f in (DISPATCH, OUTCOME, RELEASE):
            expect(call, call.invoke.attempt_id, answer.stage or call.invoke.outcome, answer.receipt)
        elif call.f == RECONCILE:
            for attempt_id, stage in answer.value.get("attempts", {}).items():
                expect(call, attempt_id, stage, answer.receipt)
    return violations


@dataclass(frozen=True)
class Observation:
    """An attempt's stage as one answer showed it, sometime between ``start`` and ``end``."""

    stage: str
    start: float
    end: float
    ops: tuple[Op, ...] = ()


def observed_stages(history: History | Iterable[Op], final: Final | None = None) -> dict[str, list[Observation]]:
    """attempt id -> the stages the acknowledged answers (then the final read) showed."""
    observed: dict[str, list[Observation]] = defaultdict(list)
    for call in calls_of(history):
        if not call.ok:
            continue
        answer = call.answer
        shown: dict[str, str] = {}
        if call.f == AUTHORIZE and answer.outcome == "ALLOW" and answer.attempt_id:
            shown[answer.attempt_id] = "AUTHORIZED"  # a new attempt is created AUTHORIZED
        elif call.f in (DISPATCH, OUTCOME, RELEASE, RENEW) and answer.stage:
            shown[call.invoke.attempt_id] = answer.stage
        elif call.f in (RECONCILE, READ):
            shown.update(answer.value.get("attempts", {}))
        for attempt_id, stage in shown.items():
            observed[attempt_id].append(Observation(stage, call.start, call.end, call.ops))
    for attempt_id, (_effect, attempt) in _final_attempts(final).items():
        observed[attempt_id].append(Observation(attempt.stage, INF, INF))
    for observations in observed.values():
        observations.sort(key=lambda o: (o.start, o.end))
    return dict(observed)


def check_stage_transitions(observations: Mapping[str, Sequence[Observation]]) -> list[Violation]:
    """Stages only move along ALLOWED_EDGES.

    Each observation is compared with every earlier one that precedes it in real time (answered
    before it was asked). ALLOWED_EDGES is closed under composition (any two-step path is also
    an edge), so an unobserved intermediate stage never hides a legal move.
    """
    violations = []
    for attempt_id, sequence in observations.items():
        for position, later in enumerate(sequence):
            if later.stage not in EDGES:
                violations.append(
                    Violation("stage_transitions", f"attempt {attempt_id}: unknown stage {later.stage!r}", later.ops)
                )
                continue
            for earlier in sequence[:position]:
                if earlier.stage not in EDGES or not earlier.end < later.start:
                    continue
                if later.stage != earlier.stage and later.stage not in EDGES[earlier.stage]:
                    violations.append(
                        Violation(
                            "stage_transitions",
                            f"attempt {attempt_id}: {earlier.stage} -> {later.stage} is not an allowed edge",
                            earlier.ops + later.ops,
                        )
                    )
                    break
    return violations


# Refusals that are the service's word that the attempt is UNKNOWN, and recorded so: a lease
# judged run out when the call held the effect's lock.
EXPIRY_REFUSALS = frozenset({"LEASE_EXPIRED"})
REVIVED_STAGES = frozenset({"AUTHORIZED", "DISPATCHED"})


def _shown_unknown(history: History | Iterable[Op], final: Final | None) -> dict[str, list[Observation]]:
    """attempt id -> the answers that showed it UNKNOWN: acknowledged answers (reads, lists,
    reports, reconciliations) and refusals whose reason says its lease ran out."""
    shown: dict[str, list[Observation]] = defaultdict(list)
    for attempt_id, observations in observed_stages(history, final).items():
        shown[attempt_id] += [o for o in observations if o.stage == "UNKNOWN" and o.end != INF]
    for call in calls_of(history):
        if call.type != "fail" or call.answer.value.get("reason") not in EXPIRY_REFUSALS:
            continue
        metadata = call.answer.value.get("metadata") or {}
        attempt_id = metadata.get("attempt_id") or call.invoke.attempt_id
        if attempt_id and metadata.get("stage", "UNKNOWN") == "UNKNOWN":
            shown[attempt_id].append(Observation("UNKNOWN", call.start, call.end, call.ops))
    return shown


def _lease_restarts(index: _Index) -> dict[str, list[Call]]:
    """attempt id -> acknowledged calls that started a new lease on it: a dispatch that moved it
    to DISPATCHED (an echo restarts nothing) and a renewal."""
    restarts: dict[str, list[Call]] = defaultdict(list)
    for call in index.calls:
        if not call.ok:
            continue
        answer = call.answer
        if (
            call.f == DISPATCH
            and answer.stage == "DISPATCHED"
            and answer.value.get("changed", True)
            or call.f == RENEW
            and answer.stage in REVIVED_STAGES
        ):
            restarts[call.invoke.attempt_id].append(call)
    return restarts


def check_unknown_never_revived(
    history: History | Iterable[Op],
    final: Final | None = None,
    leases: Mapping[str, float] | None = None,
    tolerance_seconds: float = 0.05,
) -> list[Violation]:
    """Once an answer showed an attempt UNKNOWN, no later call shows it AUTHORIZED or DISPATCHED.

    UNKNOWN means "it may have happened; ask the provider, then reconcile": a reconciler acts on
    it. An attempt that comes back DISPATCHED afterwards is being sent by a runtime while a
    reconciler may settle it not_happened, and the next attempt sends it again.

    "Showed UNKNOWN": the ``ok`` answer of any call that names the attempt's stage (a read, a
    list, a report, a reconciliation), or a definite refusal whose reason says the lease ran out
    (``EXPIRY_REFUSALS``, the attempt named in its metadata). "Later": invoked after that answer
    (``Call.precedes``), or the final read. AuthorizeEffect answers name only the effect's stage,
    so they count only for the attempt an ALLOW creates (AUTHORIZED).

    With ``leases`` (tool -> lease seconds) the rule also covers a call concurrent with the
    UNKNOWN answer that started a new lease (a dispatch answered DISPATCHED, a renewal): ordered
    after the answer it revived the attempt; ordered before it, its lease (which started no
    earlier than the call was invoked) had to run out before the answer was given. So the answer
    must come at least a lease after the call's invoke (``Op.time``, less ``tolerance_seconds``
    for the clocks), unless a report of UNKNOWN (not refused, invoked before the answer) explains
    it without a lease running out.
    """
    index = _Index(history)
    unknown = _shown_unknown(history, final)
    observed = observed_stages(history, final)
    restarts = _lease_restarts(index) if leases else {}
    reported_unknown: dict[str, float] = {}
    for call in index.calls:
        if call.f == OUTCOME and call.invoke.outcome == "UNKNOWN" and call.type != "fail":
            attempt_id = call.invoke.attempt_id
            reported_unknown[attempt_id] = min(reported_unknown.get(attempt_id, INF), call.start)
    violations = []
    for attempt_id, shown in unknown.items():
        if not shown:
            continue
        first = min(shown, key=lambda o: o.end)
        revived = next(
            (o for o in observed.get(attempt_id, []) if o.stage in REVIVED_STAGES and first.end < o.start), None
        )
        if revived is not None:
            where = "the final read" if revived.start == INF else "a later answer"
            violations.append(
                Violation(
                    "unknown_never_revived",
                    f"attempt {attempt_id} was shown UNKNOWN, then {where} showed it {revived.stage}",
                    first.ops + revived.ops,
                )
            )
            continue
        for restart in restarts.get(attempt_id, []):
            allow = index.allow_of.get(attempt_id)
            tool = restart.invoke.tool or (allow.invoke.tool if allow is not None else "")
            lease = (leases or {}).get(tool)
            if lease is None:
                continue
            early = [
                o
                for o in shown
                if o.ops
                and o.end < reported_unknown.get(attempt_id, INF)
                and o.ops[-1].time < restart.invoke.time + lease - tolerance_seconds
            ]
            if early:
                answer = early[0]
                violations.append(
                    Violation(
                        "unknown_never_revived",
                        f"attempt {attempt_id} was shown UNKNOWN {answer.ops[-1].time - restart.invoke.time:.3f} s "
                        f"after a {restart.f} that started a {lease:g} s lease was invoked, and that {restart.f} "
                        f"was answered {restart.answer.stage}",
                        answer.ops + restart.ops,
                    )
                )
                break
    return violations


def check_all(
    history: History | Iterable[Op],
    *,
    contracts: Mapping[str, Collection[str]],
    final: Final | None = None,
    budget_limits: Mapping[str, int] | None = None,
    tenant: str | None = None,
    leases: Mapping[str, float] | None = None,
) -> list[Violation]:
    """Every check; ``leases`` (tool -> lease seconds) lets ``check_unknown_never_revived`` judge
    lease restarts concurrent with an UNKNOWN answer too."""
    ops = list(history.ops if isinstance(history, History) else history)
    violations = [
        *check_no_allow_after_success(ops),
        *check_single_live_attempt(ops, contracts, final),
        *check_intent_binding(ops, final),
        *check_receipts(ops, final),
        *check_budget_samples(ops),
        *check_stage_transitions(observed_stages(ops, final)),
        *check_unknown_never_revived(ops, final, leases),
    ]
    if final is not None:
        violations += check_final_attempts(final, contracts, ops)
        violations += check_acknowledged_writes(ops, final)
    if budget_limits:
        violations += check_budget_model(ops, budget_limits, tenant)
    return violations


def summarize(violations: Iterable[Violation], limit: int = 20) -> str:
    listed = list(violations)
    shown = "\n".join(str(v) for v in itertools.islice(listed, limit))
    more = f"\n... and {len(listed) - limit} more" if len(listed) > limit else ""
    return f"{len(listed)} violation(s):\n{shown}{more}"
