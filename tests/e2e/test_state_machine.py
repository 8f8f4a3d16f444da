"""The service against a model of its documented rules, step by step, with hypothesis.

One real ``effect-ledger serve`` process on a fresh PostgreSQL database; each hypothesis example
is a fresh tenant with one run, a tenant budget and a run budget, and four tools:

- ``mail.send``     plain: an open or unknown effect must be reconciled before anything else;
- ``card.charge``   RETRY_SAME_KEY: a retry while an attempt is open reuses the provider key;
                    its contract reserves a default estimate when a request names none;
- ``wire.send``     IRREVERSIBLE: REQUIRE_APPROVAL, a reviewer decides, then a single-use ALLOW;
- ``batch.export``  a one-second lease, used only by the (rare) lease-expiry rule.

The model (``Model``) encodes docs/decisions.md: the ledger's verdict (NEW_EFFECT, DUPLICATE,
RECONCILE_REQUIRED, retry limit, a key bound to another intent), the shipped policy's denials,
approvals bound to one intent, stage edges that never regress, refused conflicting reports,
UNKNOWN leaving only through ReconcileEffect (or a success under the same provider key, which
the provider deduplicated), provider key generations, and the budget arithmetic of
reservations and settlements (an effect that happened is paid for once). Every call's answer
(outcome, reasons, stages, error code and reason) is predicted first and compared; after every
step the service is read back whole (GetEffect for every effect, ListOpenEffects, GetBudget for
both scopes, GetApproval) and compared with the model, and after every example every run's hash
chain verifies. One rule SIGKILLs the server and starts it again: the model does not change,
because every call the service acknowledged was committed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from effect_ledger.cli import verify_chains
from effect_ledger.errors import LedgerError
from effectledger.v1 import approvals_pb2, budgets_pb2, common_pb2, gate_pb2, runs_pb2, tools_pb2
from support import ServerProcess, create_pg_database, drop_pg_database, migrate, new_tenant

pytestmark = pytest.mark.postgres

MACHINE_SETTINGS = settings(
    max_examples=8,
    stateful_step_count=25,
    deadline=None,
    database=None,
    # No shrinking: a replay costs server restarts and lease waits; the failing steps are printed.
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# Expensive rules, at most this often per example (each costs about a second of wall time).
CRASHES_PER_EXAMPLE_MAX = 1
LEASE_EXPIRIES_PER_EXAMPLE_MAX = 1
LEASE_WAIT_SECONDS_MAX = 15.0

TENANT_LIMIT = 150
RUN_LIMIT = 100
DIMENSION = "usd_micros"

# --- the world the model knows -----------------------------------------------------------------

OPEN = ("AUTHORIZED", "DISPATCHED", "UNKNOWN")
# The documented attempt lifecycle (gate.proto): anything else would be a regression.
EDGES = {
    "AUTHORIZED": {"DISPATCHED", "RELEASED", "SUCCEEDED", "FAILED", "UNKNOWN"},
    "DISPATCHED": {"SUCCEEDED", "FAILED", "UNKNOWN"},
    "UNKNOWN": {"SUCCEEDED", "FAILED"},
    "SUCCEEDED": set(),
    "FAILED": set(),
    "RELEASED": set(),
}


@dataclass(frozen=True)
class Tool:
    name: str
    effect_class: int
    same_key_retry: bool = False
    max_attempts: int = 2
    lease_seconds: int = 600
    default_estimate: int = 0

    def contract(self) -> tools_pb2.PutToolContractRequest:
        return tools_pb2.PutToolContractRequest(
            contract=tools_pb2.ToolContract(
                tool=self.name,
                effect_class=self.effect_class,
                provider_idempotency=True,
                # QUERY_THEN_RETRY: the agent settles "not happened" itself, with the lookup.
                queryable=True,
                allowed_recovery=[common_pb2.QUERY_THEN_RETRY]
                + ([common_pb2.RETRY_SAME_KEY] if self.same_key_retry else []),
                max_attempts=self.max_attempts,
                lease_seconds=self.lease_seconds,
                default_estimate={DIMENSION: self.default_estimate} if self.default_estimate else {},
            )
        )


MAIL = Tool("mail.send", common_pb2.RETRYABLE_WITH_KEY, max_attempts=2)
CHARGE = Tool("card.charge", common_pb2.RETRYABLE_WITH_KEY, same_key_retry=True, max_attempts=3, default_estimate=10)
WIRE = Tool("wire.send", common_pb2.IRREVERSIBLE, max_attempts=2)
EXPORT = Tool("batch.export", common_pb2.RETRYABLE_WITH_KEY, max_attempts=2, lease_seconds=1)
TOOLS = (MAIL, CHARGE, WIRE, EXPORT)


@dataclass(frozen=True)
class Intent:
    tool: Tool
    arguments: bytes
    target: str


# Keys and the intent each names. Two mail keys share a target (an UNKNOWN effect on it blocks a
# new one); the two wire keys name the same intent (approvals bind intents, not keys).
INTENTS = {
    "mail-1": Intent(MAIL, b'{"subject":"hello","to":"bob"}', "mailto:bob@example.com"),
    "mail-2": Intent(MAIL, b'{"subject":"again","to":"bob"}', "mailto:bob@example.com"),
    "charge-1": Intent(CHARGE, b'{"amount":500}', "card:4242"),
    "charge-2": Intent(CHARGE, b'{"amount":700}', "card:4242"),
    "wire-1": Intent(WIRE, b'{"amount":9000,"to":"DE01"}', "iban:DE01"),
    "wire-2": Intent(WIRE, b'{"amount":9000,"to":"DE01"}', "iban:DE01"),
    "export-1": Intent(EXPORT, b'{"table":"orders"}', "bucket:exports"),
}
GATE_KEYS = sorted(k for k, intent in INTENTS.items() if intent.tool is not EXPORT)
# None: the request names no estimate (the contract's default applies); 0 names zero explicitly.
ESTIMATES = [None, 0, 25, 40]
USAGES = [None, 0, 20, 70]
RECEIPTS = ["ref-1", "ref-2"]
REPORTS = st.sampled_from(["succeeded", "failed:PROVIDER_REJECTED", "failed:NOT_SENT", "unknown"])
RECEIPT_DETAIL = b'{"status":"done"}'


@dataclass
class MAttempt:
    attempt_id: str
    number: int
    stage: str
    provider_key: str
    reused: bool
    reserved: int  # amount reserved in every applicable budget (0: no reservation)
    reservation: str = "NONE"  # NONE, PENDING, POSTED, VOIDED, EXPIRED
    receipt: str | None = None
    approval_id: str = ""
    lease_expired: bool = False  # UNKNOWN because its lease ran out (not by a report)


@dataclass
class MEffect:
    effect_id: str
    key: str
    intent: Intent
    attempts: list[MAttempt] = field(default_factory=list)

    @property
    def stage(self) -> str:
        """SUCCEEDED wins; then the most uncertain open stage; FAILED; RELEASED."""
        stages = {a.stage for a in self.attempts}
        for stage in ("SUCCEEDED", "UNKNOWN", "DISPATCHED", "AUTHORIZED", "FAILED"):
            if stage in stages:
                return stage
        return "RELEASED"

    @property
    def receipt(self) -> str | None:
        for attempt in reversed(self.attempts):
            if attempt.stage == "SUCCEEDED":
                return attempt.receipt
        return None

    def generations(self) -> int:
        return len({a.provider_key for a in self.attempts})


@dataclass
class MApproval:
    approval_id: str
    intent: Intent
    state: str  # PENDING, APPROVED, DENIED, REVOKED, CONSUMED


@dataclass
class Verdict:
    kind: str  # NEW_EFFECT, NEW_ATTEMPT, DUPLICATE, RECONCILE_REQUIRED, RETRY_LIMIT
    reasons: list[str]
    reuse: bool = False

    @property
    def creates_attempt(self) -> bool:
        return self.kind in ("NEW_EFFECT", "NEW_ATTEMPT")


@dataclass
class Expected:
    outcome: str
    reasons: set[str]
    approval_id: str = ""  # the approval an ALLOW consumes


class Model:
    """What the documented rules say the ledger holds for one tenant and run."""

    def __init__(self) -> None:
        self.effects: dict[str, MEffect] = {}  # by key
        self.approvals: list[MApproval] = []
        self.unreserved_posted = 0  # usage posted without a reservation

    # budgets: both budgets see the same amounts (one dimension, both always applicable)
    @property
    def pending(self) -> int:
        return sum(a.reserved for a in self.attempts() if a.reservation == "PENDING")

    def posted(self, posted_amounts: dict[str, int]) -> int:
        return self.unreserved_posted + sum(posted_amounts.values())

    def attempts(self) -> list[MAttempt]:
        return [a for e in self.effects.values() for a in e.attempts]

    def effect_of(self, attempt_id: str) -> MEffect:
        return next(e for e in self.effects.values() if any(a.attempt_id == attempt_id for a in e.attempts))

    def available(self, limit: int, posted: int) -> int:
        return max(limit - posted - self.pending, 0)

    def verdict(self, effect: MEffect | None) -> Verdict:
        if effect is None:
            return Verdict("NEW_EFFECT", [])
        stage = effect.stage
        if stage == "SUCCEEDED":
            return Verdict("DUPLICATE", ["EFFECT_SUCCEEDED"])
        tool = effect.intent.tool
        limit_reached = sum(a.stage != "RELEASED" for a in effect.attempts) >= tool.max_attempts
        if stage in OPEN:
            if not tool.same_key_retry:
                return Verdict("RECONCILE_REQUIRED", [f"EFFECT_{stage}"])
            if limit_reached:
                return Verdict("RETRY_LIMIT", ["RETRY_LIMIT_EXCEEDED"])
            return Verdict("NEW_ATTEMPT", ["RETRY_SAME_KEY"], reuse=True)
        if limit_reached:
            return Verdict("RETRY_LIMIT", ["RETRY_LIMIT_EXCEEDED"])
        return Verdict("NEW_ATTEMPT", [f"EFFECT_{stage}"])

    def valid_approvals(self, intent: Intent) -> list[MApproval]:
        return sorted(
            (a for a in self.approvals if a.intent == intent and a.state == "APPROVED"), key=lambda a: a.approval_id
        )

    def expect_authorize(self, key: str, estimate: int, posted: int) -> tuple[Verdict, Expected]:
        intent = INTENTS[key]
        effect = self.effects.get(key)
        verdict = self.verdict(effect)
        # The shipped policy: denials first, then approvals.
        deny = set()
        if estimate > 0 and any(estimate > self.available(limit, posted) for limit in (TENANT_LIMIT, RUN_LIMIT)):
            deny.add("BUDGET_EXHAUSTED")
        if verdict.kind == "NEW_EFFECT" and any(
            e.intent.tool == intent.tool and e.intent.target == intent.target and e.stage == "UNKNOWN"
            for e in self.effects.values()
        ):
            deny.add("TARGET_HAS_UNKNOWN_EFFECT")
        needs_approval = intent.tool is WIRE
        valid = self.valid_approvals(intent)
        if needs_approval and not valid and any(a.intent == intent and a.state == "DENIED" for a in self.approvals):
            deny.add("APPROVAL_DENIED")
        if deny:
            policy, policy_reasons = "DENY", deny
        elif needs_approval and not valid:
            policy, policy_reasons = "REQUIRE_APPROVAL", {"IRREVERSIBLE_TOOL"}
        else:
            policy, policy_reasons = "ALLOW", set()
        # Policy only narrows: the ledger's own answers stand.
        if not verdict.creates_attempt:
            outcome = {"DUPLICATE": "DUPLICATE", "RECONCILE_REQUIRED": "RECONCILE_REQUIRED", "RETRY_LIMIT": "DENY"}[
                verdict.kind
            ]
            extra = policy_reasons if policy != "ALLOW" else set()
            return verdict, Expected(outcome, set(verdict.reasons) | extra)
        if policy == "ALLOW":
            return verdict, Expected("ALLOW", set(verdict.reasons), valid[0].approval_id if needs_approval else "")
        return verdict, Expected(policy, policy_reasons)


def merged_estimate(tool: Tool, requested: int | None) -> int:
    """The contract's default estimate is a floor: a request may raise it, never lower it."""
    return tool.default_estimate if requested is None else max(tool.default_estimate, requested)


def estimate_map(requested: int | None) -> dict[str, int]:
    return {} if requested is None else {DIMENSION: requested}


def receipt(reference: str) -> common_pb2.Receipt:
    return common_pb2.Receipt(provider_reference=reference, detail_json=RECEIPT_DETAIL)


def attempt_report(attempt: MAttempt, kind: str, evidence: str = "", reference: str | None = None) -> tuple[str, str]:
    """What a report does to an attempt: ("applied", stage), ("same", stage) or ("refused", reason)."""
    stage = attempt.stage
    if kind == "DISPATCHED":
        # Accepted while it may still be sent; any other answer means "do not send".
        if stage == "AUTHORIZED":
            return "applied", "DISPATCHED"
        if stage == "RELEASED":
            return "refused", "ATTEMPT_RELEASED"
        if stage == "UNKNOWN":
            return "refused", "LEASE_EXPIRED" if attempt.lease_expired else "ATTEMPT_NOT_OPEN"
        if stage == "FAILED":
            return "refused", "ATTEMPT_SETTLED"
        return "same", stage
    if kind == "RELEASED":
        if stage == "AUTHORIZED":
            return "applied", "RELEASED"
        if stage == "RELEASED":
            return "same", stage
        return "refused", "ATTEMPT_NOT_RELEASABLE"
    if stage in ("AUTHORIZED", "DISPATCHED"):
        if kind == "FAILED" and evidence == "NOT_SENT" and stage == "DISPATCHED":
            return "refused", "DISPATCH_RECORDED"
        return "applied", kind
    if stage == "UNKNOWN":  # no report moves it: ReconcileEffect (or a same-key sibling's success)
        return ("same", stage) if kind == "UNKNOWN" else ("refused", "RECONCILE_REQUIRED")
    if stage == "SUCCEEDED":
        if kind == "UNKNOWN" or (kind == "SUCCEEDED" and reference == attempt.receipt):
            return "same", stage
        return "refused", "CONFLICTING_OUTCOME"
    if stage == "FAILED":
        return ("same", stage) if kind in ("FAILED", "UNKNOWN") else ("refused", "CONFLICTING_OUTCOME")
    # RELEASED: never sent; only "not sent" agrees.
    if kind == "FAILED" and evidence == "NOT_SENT":
        return "same", stage
    return "refused", "ATTEMPT_RELEASED"


def stage_name(value: int) -> str:
    return common_pb2.Stage.Name(value)


def call(method, request):
    """(response, None) or (None, (grpc code name, ErrorInfo reason))."""
    try:
        return method(request), None
    except LedgerError as error:
        return None, (error.grpc_code.name, error.reason)  # type: ignore[attr-defined]


# --- the machine -------------------------------------------------------------------------------


class LedgerMachine(RuleBasedStateMachine):
    server: ServerProcess
    database_url: str
    stats: dict[str, int]

    def __init__(self) -> None:
        super().__init__()
        self.tenant = new_tenant(self.database_url)
        self._connect()
        for tool in TOOLS:
            self.admin.tools.PutToolContract(tool.contract())
        self.run_id = self.agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        self.admin.budgets.PutBudget(
            budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension=DIMENSION, limit=TENANT_LIMIT)
        )
        self.admin.budgets.PutBudget(
            budgets_pb2.PutBudgetRequest(
                scope=budgets_pb2.RUN, scope_id=self.run_id, dimension=DIMENSION, limit=RUN_LIMIT
            )
        )
        self.model = Model()
        self.posted_by_attempt: dict[str, int] = {}
        self.seen_stage: dict[str, str] = {}
        self.crashes = 0
        self.lease_expiries = 0
        self.stats["examples"] += 1

    def _connect(self) -> None:
        self.agent = self.tenant.client(self.server, "agent")
        self.admin = self.tenant.client(self.server, "admin")
        self.reviewer = self.tenant.client(self.server, "reviewer")

    def _close(self) -> None:
        for client in (self.agent, self.admin, self.reviewer):
            client.close()

    def teardown(self) -> None:
        self._close()
        # Whatever happened (crashes included), every run's hash chain still verifies.
        assert verify_chains(self.database_url) == []

    def _count(self, name: str) -> None:
        self.stats[name] = self.stats.get(name, 0) + 1

    @property
    def posted(self) -> int:
        return self.model.posted(self.posted_by_attempt)

    # --- authorize ------------------------------------------------------------------------

    def _authorize(self, key: str, requested: int | None) -> gate_pb2.AuthorizeEffectResponse:
        intent = INTENTS[key]
        estimate = merged_estimate(intent.tool, requested)
        verdict, expected = self.model.expect_authorize(key, estimate, self.posted)
        request = gate_pb2.AuthorizeEffectRequest(
            run_id=self.run_id,
            tool=intent.tool.name,
            arguments_json=intent.arguments,
            idempotency_key=key,
            target=intent.target,
            estimate=estimate_map(requested),
        )
        response, error = call(self.agent.gate.AuthorizeEffect, request)
        assert error is None, f"AuthorizeEffect({key}) failed: {error}"
        outcome = common_pb2.Outcome.Name(response.outcome)
        codes = {r.code for r in response.reasons}
        assert (outcome, codes) == (expected.outcome, expected.reasons), (
            f"AuthorizeEffect({key}, estimate={estimate}, verdict {verdict.kind}): expected {expected}, "
            f"got {outcome} {codes}"
        )
        self._count(f"authorize:{intent.tool.name}:{outcome}")
        effect = self.model.effects.get(key)
        if outcome == "ALLOW":
            effect = self._allowed(key, intent, response, verdict, expected, estimate)
        elif outcome == "REQUIRE_APPROVAL":
            self._approval_requested(intent, response)
        else:
            assert not response.attempt_id and not response.approval_request_id
        if effect is None:
            assert response.effect_id == "" and response.effect_stage == common_pb2.STAGE_UNSPECIFIED
        else:
            assert response.effect_id == effect.effect_id
            assert stage_name(response.effect_stage) == effect.stage
        if outcome == "DUPLICATE":
            assert response.receipt.provider_reference == effect.receipt
        return response

    def _allowed(self, key, intent, response, verdict, expected, estimate) -> MEffect:
        effect = self.model.effects.get(key)
        if effect is None:
            assert response.effect_id
            effect = self.model.effects[key] = MEffect(response.effect_id, key, intent)
        number = len(effect.attempts) + 1
        if verdict.reuse:
            open_keys = [a.provider_key for a in effect.attempts if a.stage in OPEN]
            provider_key = open_keys[-1]
        else:
            provider_key = f"{effect.effect_id}.{effect.generations() + 1}"
        assert response.attempt_number == number
        assert response.provider_key_reused == verdict.reuse
        assert response.provider_idempotency_key == provider_key, (response.provider_idempotency_key, provider_key)
        assert response.approval_id == expected.approval_id
        # A reservation in each applicable budget (tenant and run) when the estimate is positive.
        assert len(response.reservation_ids) == (2 if estimate > 0 else 0)
        effect.attempts.append(
            MAttempt(
                response.attempt_id,
                number,
                "AUTHORIZED",
                provider_key,
                verdict.reuse,
                estimate,
                "PENDING" if estimate > 0 else "NONE",
                approval_id=expected.approval_id,
            )
        )
        if expected.approval_id:  # single use
            approval = next(a for a in self.model.approvals if a.approval_id == expected.approval_id)
            approval.state = "CONSUMED"
            self._count("approval:CONSUMED")
        return effect

    def _approval_requested(self, intent: Intent, response) -> None:
        pending = [a for a in self.model.approvals if a.intent == intent and a.state == "PENDING"]
        if pending:  # the open request for the intent is returned, not a new one
            assert response.approval_request_id == pending[-1].approval_id
        else:
            assert response.approval_request_id
            assert response.approval_request_id not in {a.approval_id for a in self.model.approvals}
            self.model.approvals.append(MApproval(response.approval_request_id, intent, "PENDING"))

    @rule(key=st.sampled_from(GATE_KEYS), requested=st.sampled_from(ESTIMATES))
    def authorize(self, key, requested):
        self._authorize(key, requested)

    @precondition(lambda self: self.model.effects)
    @rule(data=st.data(), change=st.sampled_from(["arguments", "target", "tool"]))
    def authorize_with_a_bound_key_and_another_intent(self, data, change):
        key = data.draw(st.sampled_from(sorted(self.model.effects)), label="key")
        intent = INTENTS[key]
        arguments, target, tool = intent.arguments, intent.target, intent.tool.name
        if change == "arguments":
            arguments = b'{"changed":true}'
        elif change == "target":
            target = "elsewhere:1"
        else:
            tool = next(t.name for t in TOOLS if t is not intent.tool and t is not EXPORT)
        request = gate_pb2.AuthorizeEffectRequest(
            run_id=self.run_id, tool=tool, arguments_json=arguments, idempotency_key=key, target=target
        )
        response, error = call(self.agent.gate.AuthorizeEffect, request)
        assert response is None and error == ("FAILED_PRECONDITION", "IDEMPOTENCY_KEY_REUSED"), (response, error)
        self._count("authorize:KEY_REUSED")

    # --- reports about attempts -----------------------------------------------------------

    def _pick_attempt(self, data) -> tuple[MEffect, MAttempt]:
        """Any attempt, settled ones included (echoes and conflicts), open ones more often."""
        every = [a.attempt_id for a in self.model.attempts()]
        still_open = [a.attempt_id for a in self.model.attempts() if a.stage in OPEN]
        if still_open and data.draw(st.booleans(), label="prefer an open attempt"):
            every = still_open
        attempt = data.draw(st.sampled_from(every), label="attempt")
        effect = self.model.effect_of(attempt)
        return effect, next(a for a in effect.attempts if a.attempt_id == attempt)

    def _report(
        self, effect: MEffect, attempt: MAttempt, method, request, kind, evidence="", reference=None, usage=None
    ):
        what, value = attempt_report(attempt, kind, evidence, reference)
        response, error = call(method, request)
        if what == "refused":
            assert response is None and error == ("FAILED_PRECONDITION", value), (kind, attempt.stage, response, error)
            self._count(f"report:{kind}:refused")
            return
        assert error is None, (kind, attempt.stage, error)
        if what == "applied":
            self._settle_report(attempt, value, usage, effect.intent.tool.default_estimate)
            attempt.stage = value
            if value == "SUCCEEDED":
                attempt.receipt = reference
                self._deduplicate_siblings(effect, attempt)
        assert response.changed == (what == "applied"), (kind, what, response)
        assert stage_name(response.attempt.stage) == attempt.stage
        assert stage_name(response.effect_stage) == effect.stage
        self._count(f"report:{kind}:{what}")

    def _deduplicate_siblings(self, effect: MEffect, succeeded: MAttempt) -> None:
        """RETRY_SAME_KEY: the provider deduplicates by the shared key, so a success settles every
        other open attempt under that key (SUCCEEDED, same receipt) and releases its money."""
        for sibling in effect.attempts:
            if sibling is not succeeded and sibling.stage in OPEN and sibling.provider_key == succeeded.provider_key:
                sibling.stage = "SUCCEEDED"
                sibling.receipt = succeeded.receipt
                if sibling.reservation == "PENDING":
                    sibling.reservation = "VOIDED"
                self._count("report:SUCCEEDED:deduplicated")

    def _settle_report(self, attempt: MAttempt, stage: str, usage: int | None, floor: int = 0) -> None:
        """SUCCEEDED posts the usage (never below the contract's floor) or the estimate; FAILED
        and RELEASED void; UNKNOWN holds."""
        if usage is not None:
            usage = max(usage, floor)
        if stage == "SUCCEEDED":
            if attempt.reservation == "PENDING":
                attempt.reservation = "POSTED"
                self.posted_by_attempt[attempt.attempt_id] = attempt.reserved if usage is None else usage
            elif usage:
                self.model.unreserved_posted += usage
        elif stage in ("FAILED", "RELEASED") and attempt.reservation == "PENDING":
            attempt.reservation = "VOIDED"

    @precondition(lambda self: self.model.attempts())
    @rule(data=st.data())
    def dispatch(self, data):
        effect, attempt = self._pick_attempt(data)
        request = gate_pb2.RecordDispatchRequest(attempt_id=attempt.attempt_id)
        self._report(effect, attempt, self.agent.gate.RecordDispatch, request, "DISPATCHED")

    def _record_outcome(
        self, effect: MEffect, attempt: MAttempt, report: str, reference: str, usage: int | None
    ) -> None:
        if report == "succeeded":
            request = gate_pb2.RecordOutcomeRequest(
                attempt_id=attempt.attempt_id,
                succeeded=gate_pb2.RecordOutcomeRequest.Succeeded(
                    receipt=receipt(reference), usage={} if usage is None else {DIMENSION: usage}
                ),
            )
            self._report(
                effect, attempt, self.agent.gate.RecordOutcome, request, "SUCCEEDED", reference=reference, usage=usage
            )
        elif report == "unknown":
            request = gate_pb2.RecordOutcomeRequest(
                attempt_id=attempt.attempt_id, unknown=gate_pb2.RecordOutcomeRequest.Unknown(reason="timeout")
            )
            self._report(effect, attempt, self.agent.gate.RecordOutcome, request, "UNKNOWN")
        else:
            evidence = report.split(":")[1]
            request = gate_pb2.RecordOutcomeRequest(
                attempt_id=attempt.attempt_id,
                failed=gate_pb2.RecordOutcomeRequest.Failed(
                    reason="provider said no", evidence=gate_pb2.FailureEvidence.Value(evidence)
                ),
            )
            self._report(effect, attempt, self.agent.gate.RecordOutcome, request, "FAILED", evidence=evidence)

    @precondition(lambda self: self.model.attempts())
    @rule(data=st.data(), report=REPORTS, reference=st.sampled_from(RECEIPTS), usage=st.sampled_from(USAGES))
    def outcome(self, data, report, reference, usage):
        effect, attempt = self._pick_attempt(data)
        self._record_outcome(effect, attempt, report, reference, usage)

    @rule(
        key=st.sampled_from(GATE_KEYS),
        requested=st.sampled_from(ESTIMATES),
        dispatch=st.booleans(),
        report=REPORTS,
        reference=st.sampled_from(RECEIPTS),
        usage=st.sampled_from(USAGES),
    )
    def authorize_dispatch_and_report(self, key, requested, dispatch, report, reference, usage):
        """A whole cycle in one step, as a runtime runs it: authorize, maybe dispatch, report."""
        response = self._authorize(key, requested)
        if response.outcome != common_pb2.ALLOW:
            return
        effect = self.model.effects[key]
        attempt = effect.attempts[-1]
        if dispatch:
            request = gate_pb2.RecordDispatchRequest(attempt_id=attempt.attempt_id)
            self._report(effect, attempt, self.agent.gate.RecordDispatch, request, "DISPATCHED")
        self._record_outcome(effect, attempt, report, reference, usage)

    @precondition(lambda self: self.model.attempts())
    @rule(data=st.data())
    def release(self, data):
        effect, attempt = self._pick_attempt(data)
        request = gate_pb2.ReleaseAttemptRequest(attempt_id=attempt.attempt_id, reason="plan changed")
        self._report(effect, attempt, self.agent.gate.ReleaseAttempt, request, "RELEASED")

    @precondition(lambda self: self.model.attempts())
    @rule(data=st.data())
    def renew_lease(self, data):
        _, attempt = self._pick_attempt(data)
        response, error = call(self.agent.gate.RenewLease, gate_pb2.RenewLeaseRequest(attempt_id=attempt.attempt_id))
        if attempt.stage in ("AUTHORIZED", "DISPATCHED"):
            assert error is None and response.changed and stage_name(response.attempt.stage) == attempt.stage, error
        elif attempt.stage == "UNKNOWN":
            assert error == ("FAILED_PRECONDITION", "LEASE_EXPIRED"), (response, error)
        else:
            assert error == ("FAILED_PRECONDITION", "ATTEMPT_NOT_OPEN"), (response, error)

    # --- reconciliation -------------------------------------------------------------------

    @precondition(lambda self: self.model.effects)
    @rule(data=st.data(), evidence=st.sampled_from(["receipt:ref-1", "receipt:ref-2", "not_happened"]))
    def reconcile(self, data, evidence):
        effect = self.model.effects[data.draw(st.sampled_from(sorted(self.model.effects)), label="key")]
        reference = evidence.split(":")[1] if evidence.startswith("receipt") else None
        if reference:
            request = gate_pb2.ReconcileEffectRequest(effect_id=effect.effect_id, receipt=receipt(reference))
        else:
            request = gate_pb2.ReconcileEffectRequest(
                effect_id=effect.effect_id,
                not_happened=gate_pb2.ReconcileEffectRequest.NotHappened(
                    reason="the provider has no record",
                    lookup_reference="lookup-1",
                    lookup_result_json=b'{"found":false}',
                ),
            )
        open_attempts = [a for a in effect.attempts if a.stage in OPEN]
        stage = effect.stage
        if open_attempts:
            refused = None
        elif stage == "SUCCEEDED" and reference is not None:
            refused = None if reference == effect.receipt else "CONFLICTING_OUTCOME"
        elif stage in ("FAILED", "RELEASED") and reference is None:
            refused = None
        else:
            refused = "CONFLICTING_OUTCOME"
        response, error = call(self.agent.gate.ReconcileEffect, request)
        if refused:
            assert response is None and error == ("FAILED_PRECONDITION", refused), (stage, evidence, error)
            self._count("reconcile:refused")
            return
        assert error is None, (stage, evidence, error)
        # Every open attempt settles together, and the money follows. Not happened: released.
        # A receipt: the effect happened once per provider key, so the first attempt under the
        # key posts its estimate (even one whose reservation expired with its lease) and the
        # others' reservations are released.
        posting: set[str] = set()
        for attempt in open_attempts:
            if reference and attempt.provider_key not in posting:
                posting.add(attempt.provider_key)
                if attempt.reservation in ("PENDING", "EXPIRED"):
                    self.posted_by_attempt[attempt.attempt_id] = attempt.reserved
                if attempt.reservation == "PENDING":
                    attempt.reservation = "POSTED"
            elif attempt.reservation == "PENDING":
                attempt.reservation = "VOIDED"
                if reference:
                    self._count("reconcile:same-key-paid-once")
            attempt.stage = "SUCCEEDED" if reference else "FAILED"
            attempt.receipt = reference
        assert stage_name(response.stage) == effect.stage
        assert [stage_name(a.stage) for a in response.attempts] == [a.stage for a in effect.attempts]
        self._count("reconcile:" + ("settled" if open_attempts else "echo"))

    # --- approvals ------------------------------------------------------------------------

    @precondition(lambda self: self.model.approvals)
    @rule(data=st.data(), action=st.sampled_from(["approve", "approve", "deny", "revoke"]))
    def review(self, data, action):
        """The reviewer approves or denies a request (only a PENDING one), or revokes one."""
        approval = data.draw(st.sampled_from(self.model.approvals), label="approval")
        if action == "revoke":
            request = approvals_pb2.RevokeApprovalRequest(approval_id=approval.approval_id, reason="changed my mind")
            response, error = call(self.reviewer.approvals.RevokeApproval, request)
            if approval.state in ("DENIED", "CONSUMED"):
                assert response is None and error == ("FAILED_PRECONDITION", "APPROVAL_NOT_PENDING"), (approval, error)
                return
            approval.state = "REVOKED"  # before use: it never counts again
        else:
            approve = action == "approve"
            request = approvals_pb2.DecideApprovalRequest(
                approval_id=approval.approval_id, approve=approve, comment="" if approve else "too risky"
            )
            response, error = call(self.reviewer.approvals.DecideApproval, request)
            if approval.state != "PENDING":
                assert response is None and error == ("FAILED_PRECONDITION", "APPROVAL_NOT_PENDING"), (approval, error)
                return
            approval.state = "APPROVED" if approve else "DENIED"
        assert error is None, error
        assert approvals_pb2.ApprovalState.Name(response.state) == approval.state
        self._count("approval:" + approval.state)

    # --- time and crashes -----------------------------------------------------------------

    @precondition(lambda self: self.lease_expiries < LEASE_EXPIRIES_PER_EXAMPLE_MAX)
    @rule(requested=st.sampled_from([None, 30]), dispatch=st.booleans())
    def lease_runs_out(self, requested, dispatch):
        """An attempt of the one-second-lease tool outlives its lease: it turns UNKNOWN by the
        database clock. Never dispatched: its reservation is let go; dispatched: it stays held."""
        response = self._authorize("export-1", requested)
        if response.outcome != common_pb2.ALLOW:
            return
        self.lease_expiries += 1
        effect = self.model.effects["export-1"]
        attempt = effect.attempts[-1]
        dispatched = False
        if dispatch:
            answer, error = call(
                self.agent.gate.RecordDispatch, gate_pb2.RecordDispatchRequest(attempt_id=attempt.attempt_id)
            )
            # A stalled machine may let the lease run out first: the answer says which happened.
            dispatched = error is None
            if dispatched:
                assert answer.changed and stage_name(answer.attempt.stage) == "DISPATCHED"
            else:
                assert error == ("FAILED_PRECONDITION", "LEASE_EXPIRED"), error
        deadline = time.monotonic() + LEASE_WAIT_SECONDS_MAX
        while True:
            shown = self.agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect.effect_id))
            if stage_name(shown.attempts[-1].stage) == "UNKNOWN":
                break
            assert time.monotonic() < deadline, "the lease never ran out"
            time.sleep(0.1)
        # A writer touching the effect records the expiry (if the sweeper has not yet).
        _, error = call(self.agent.gate.RenewLease, gate_pb2.RenewLeaseRequest(attempt_id=attempt.attempt_id))
        assert error == ("FAILED_PRECONDITION", "LEASE_EXPIRED"), error
        attempt.stage = "UNKNOWN"
        attempt.lease_expired = True
        if not dispatched and attempt.reservation == "PENDING":
            attempt.reservation = "EXPIRED"
        self._count("lease:expired:" + ("dispatched" if dispatched else "authorized"))

    @precondition(lambda self: self.crashes < CRASHES_PER_EXAMPLE_MAX)
    @rule()
    def crash_and_restart(self):
        """SIGKILL, then start again: every acknowledged call was committed, so nothing changes."""
        self.crashes += 1
        self._close()
        self.server.kill()
        self.server.port = 0  # a fresh port: the old one may have been taken meanwhile
        self.server.start()
        self._connect()
        self._count("crash")

    # --- after every step: the service, read back whole, agrees with the model ------------

    @invariant()
    def service_agrees_with_the_model(self):
        for effect in self.model.effects.values():
            shown = self.agent.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect.effect_id))
            assert stage_name(shown.stage) == effect.stage, (effect.key, stage_name(shown.stage), effect)
            assert len(shown.attempts) == len(effect.attempts), (effect.key, shown.attempts, effect)
            for got, want in zip(shown.attempts, effect.attempts, strict=True):
                stage = stage_name(got.stage)
                assert (got.attempt_id, got.number, stage) == (want.attempt_id, want.number, want.stage), (got, want)
                assert got.provider_idempotency_key == want.provider_key
                assert got.provider_key_reused == want.reused
                assert got.approval_id == want.approval_id
                assert (got.receipt.provider_reference or None) == (want.receipt if stage == "SUCCEEDED" else None)
                before = self.seen_stage.get(got.attempt_id)
                assert before is None or stage == before or stage in EDGES[before], f"regressed {before} -> {stage}"
                self.seen_stage[got.attempt_id] = stage
            assert (shown.receipt.provider_reference or None) == effect.receipt
        listed = self.agent.gate.ListOpenEffects(gate_pb2.ListOpenEffectsRequest(run_id=self.run_id))
        assert {e.effect_id for e in listed.effects} == {
            e.effect_id for e in self.model.effects.values() if e.stage in OPEN
        }
        pending = {a.attempt_id: a.reserved for a in self.model.attempts() if a.reservation == "PENDING"}
        for scope, scope_id, limit in (
            (budgets_pb2.TENANT, "", TENANT_LIMIT),
            (budgets_pb2.RUN, self.run_id, RUN_LIMIT),
        ):
            answer = self.agent.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=scope, scope_id=scope_id))
            (budget,) = answer.budgets
            assert (budget.limit, budget.posted, budget.pending) == (limit, self.posted, self.model.pending), (
                budgets_pb2.BudgetScope.Name(scope),
                budget,
                self.posted,
                self.model.pending,
            )
            assert budget.available == max(limit - self.posted - self.model.pending, 0)
            assert {r.attempt_id: r.amount for r in answer.open_reservations} == pending
        for approval in self.model.approvals:
            shown = self.agent.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=approval.approval_id))
            assert approvals_pb2.ApprovalState.Name(shown.state) == approval.state, (approval, shown.state)


@pytest.fixture(scope="module")
def ledger_server():
    url = create_pg_database("el_sm")
    server = ServerProcess(url, ["--lease-sweep-interval-seconds", "0.2"])
    try:
        migrate(url)
        server.start()
        yield url, server
    finally:
        server.stop()
        drop_pg_database(url)


def test_the_service_follows_the_model(ledger_server):
    url, server = ledger_server
    stats: dict[str, int] = {"examples": 0}
    LedgerMachine.database_url = url
    LedgerMachine.server = server
    LedgerMachine.stats = stats
    started = time.monotonic()
    run_state_machine_as_test(LedgerMachine, settings=MACHINE_SETTINGS)
    elapsed = time.monotonic() - started
    print(f"\nstate machine: {elapsed:.1f} s, {dict(sorted(stats.items()))}")
    assert stats["examples"] >= 1


def test_a_reconciled_receipt_pays_once_for_attempts_sharing_a_provider_key(ledger_server):
    """Two open attempts under one provider key (RETRY_SAME_KEY), settled by one receipt: the
    provider applied the effect once, so its estimate is posted once and the other released."""
    url, server = ledger_server
    tenant = new_tenant(url)
    with tenant.client(server, "admin") as admin, tenant.client(server, "agent") as agent:
        admin.tools.PutToolContract(CHARGE.contract())
        admin.budgets.PutBudget(
            budgets_pb2.PutBudgetRequest(scope=budgets_pb2.TENANT, dimension=DIMENSION, limit=TENANT_LIMIT)
        )
        run_id = agent.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id
        intent = INTENTS["charge-1"]
        request = gate_pb2.AuthorizeEffectRequest(
            run_id=run_id,
            tool=CHARGE.name,
            arguments_json=intent.arguments,
            idempotency_key="charge-1",
            target=intent.target,
            estimate={DIMENSION: 25},
        )
        first = agent.gate.AuthorizeEffect(request)
        agent.gate.RecordOutcome(
            gate_pb2.RecordOutcomeRequest(attempt_id=first.attempt_id, unknown=gate_pb2.RecordOutcomeRequest.Unknown())
        )
        retry = agent.gate.AuthorizeEffect(request)
        assert retry.provider_key_reused and retry.provider_idempotency_key == first.provider_idempotency_key
        agent.gate.RecordDispatch(gate_pb2.RecordDispatchRequest(attempt_id=retry.attempt_id))

        def budget() -> tuple[int, int]:
            found = agent.budgets.GetBudget(budgets_pb2.GetBudgetRequest(scope=budgets_pb2.TENANT)).budgets[0]
            return found.posted, found.pending

        assert budget() == (0, 50)
        settled = agent.gate.ReconcileEffect(
            gate_pb2.ReconcileEffectRequest(effect_id=first.effect_id, receipt=receipt("ref-1"))
        )
        assert [stage_name(a.stage) for a in settled.attempts] == ["SUCCEEDED", "SUCCEEDED"]
        assert budget() == (25, 0)
