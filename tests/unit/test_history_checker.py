"""The history checker (tests/history.py): one clean history passes every check, and each
property, violated on purpose, is reported with the operations that show it."""

from __future__ import annotations

import grpc
import pytest
from history import (
    AUTHORIZE,
    BUDGET_READ,
    DISPATCH,
    OUTCOME,
    READ,
    RECONCILE,
    RELEASE,
    RENEW,
    FinalAttempt,
    FinalEffect,
    History,
    Observation,
    Op,
    calls_of,
    check_acknowledged_writes,
    check_all,
    check_budget_model,
    check_budget_samples,
    check_final_attempts,
    check_intent_binding,
    check_no_allow_after_success,
    check_receipts,
    check_single_live_attempt,
    check_stage_transitions,
    check_unknown_never_revived,
    classify_status,
    observed_stages,
)

TENANT = "t-1"
MAIL = "email.send"
CHARGE = "payment.charge"
CONTRACTS = {MAIL: ("QUERY_THEN_RETRY",), CHARGE: ("RETRY_SAME_KEY",)}
DIGEST = "a" * 64
OTHER_DIGEST = "b" * 64


class Script:
    """Builds histories call by call: ``begin`` opens a call, ``ok``/``fail``/``info`` ends it."""

    def __init__(self) -> None:
        self.h = History()

    def begin(self, f: str, process: str = "p1", **fields) -> Op:
        fields.setdefault("tenant", TENANT)
        return self.h.invoke(process, f, **fields)

    def ok(self, invoke: Op, **fields) -> Op:
        return self.h.ok(invoke, **fields)

    def fail(self, invoke: Op, **fields) -> Op:
        return self.h.fail(invoke, **fields)

    def info(self, invoke: Op, **fields) -> Op:
        return self.h.info(invoke, **fields)

    # one-call helpers: (invoke, completion)

    def authorize(
        self,
        key,
        outcome,
        *,
        effect="",
        attempt="",
        tool=MAIL,
        digest=DIGEST,
        answered_digest=None,
        receipt="",
        estimate=None,
        process="p1",
        result="ok",
    ):
        invoke = self.begin(AUTHORIZE, process, key=key, tool=tool, digest=digest, value={"estimate": estimate or {}})
        if result == "info":
            return invoke, self.info(invoke, error="UNAVAILABLE : Socket closed")
        if result == "fail":
            return invoke, self.fail(invoke, error="FAILED_PRECONDITION IDEMPOTENCY_KEY_REUSED")
        stage = "AUTHORIZED" if outcome == "ALLOW" else ("SUCCEEDED" if outcome == "DUPLICATE" else "")
        return invoke, self.ok(
            invoke,
            outcome=outcome,
            effect_id=effect,
            attempt_id=attempt,
            digest=answered_digest or digest,
            stage=stage,
            receipt=receipt,
        )

    def allow(self, key, attempt, effect, **kw):
        return self.authorize(key, "ALLOW", effect=effect, attempt=attempt, **kw)

    def report(
        self,
        f,
        attempt,
        stage,
        *,
        outcome=None,
        receipt="",
        key="",
        effect="",
        tool=MAIL,
        result="ok",
        changed=True,
        process="p1",
        usage=None,
    ):
        outcome = outcome or {DISPATCH: "DISPATCHED", RELEASE: "RELEASED"}.get(f, stage)
        invoke = self.begin(
            f,
            process,
            key=key,
            tool=tool,
            effect_id=effect,
            attempt_id=attempt,
            outcome=outcome,
            receipt=receipt if outcome == "SUCCEEDED" else "",
            value={"usage": usage or {}},
        )
        if result == "info":
            return invoke, self.info(invoke, error="UNAVAILABLE : Socket closed")
        if result == "fail":
            return invoke, self.fail(invoke, error="FAILED_PRECONDITION RECONCILE_REQUIRED")
        return invoke, self.ok(
            invoke, stage=stage, receipt=receipt if stage == "SUCCEEDED" else "", value={"changed": changed}
        )

    def dispatch(self, attempt, **kw):
        return self.report(DISPATCH, attempt, "DISPATCHED", **kw)

    def outcome(self, attempt, stage, **kw):
        return self.report(OUTCOME, attempt, stage, **kw)

    def release(self, attempt, **kw):
        return self.report(RELEASE, attempt, "RELEASED", **kw)

    def reconcile(self, effect, happened, attempts, *, key="", receipt="", result="ok", process="p1"):
        outcome = "SUCCEEDED" if happened else "FAILED"
        invoke = self.begin(RECONCILE, process, key=key, effect_id=effect, outcome=outcome, receipt=receipt)
        if result == "info":
            return invoke, self.info(invoke, error="DEADLINE_EXCEEDED")
        return invoke, self.ok(invoke, stage=outcome, receipt=receipt, value={"attempts": attempts})

    def read(self, effect, stage, attempts, *, key="", receipt=""):
        invoke = self.begin(READ, key=key, effect_id=effect)
        return invoke, self.ok(invoke, stage=stage, receipt=receipt, value={"attempts": attempts})

    def budget_read(self, posted, pending, limit=150):
        invoke = self.begin(BUDGET_READ, "sampler")
        budget = {"budget_id": "bud-1", "dimension": "usd_micros", "limit": limit, "posted": posted, "pending": pending}
        return invoke, self.ok(invoke, value={"budgets": [budget]})


def final(*effects: FinalEffect) -> dict[str, FinalEffect]:
    return {effect.effect_id: effect for effect in effects}


def effect(effect_id, key, stage, *attempts, tool=MAIL, digest=DIGEST, receipt=""):
    return FinalEffect(effect_id, TENANT, key, tool, stage, digest, receipt, tuple(attempts))


def attempt(attempt_id, number, stage, receipt=""):
    return FinalAttempt(attempt_id, number, stage, receipt, dispatched=stage != "AUTHORIZED")


def indices(*pairs) -> set[int]:
    return {op.index for pair in pairs for op in pair}


def only(violations, prop):
    assert [v.property for v in violations] == [prop], "\n".join(map(str, violations))
    return violations[0]


# --- a clean history --------------------------------------------------------------------------


def clean_history() -> tuple[Script, dict[str, FinalEffect]]:
    s = Script()
    est = {"usd_micros": 30}
    # k1: the whole cycle, then a DUPLICATE with the receipt.
    s.allow("k1", "a1", "e1", estimate=est)
    s.budget_read(0, 30)
    s.dispatch("a1")
    s.outcome("a1", "SUCCEEDED", receipt="r1")
    s.authorize("k1", "DUPLICATE", effect="e1", receipt="r1")
    # k2: the ALLOW is lost; the key answers RECONCILE_REQUIRED; the runtime never sent it.
    s.authorize("k2", "ALLOW", estimate=est, result="info", process="p2")
    s.authorize("k2", "RECONCILE_REQUIRED", effect="e2", process="p2")
    s.read("e2", "AUTHORIZED", {"a2x": "AUTHORIZED"}, key="k2")
    s.reconcile("e2", False, {"a2x": "FAILED"}, key="k2", process="p2")
    s.allow("k2", "a2", "e2", estimate=est, process="p2")
    s.dispatch("a2", process="p2")
    s.outcome("a2", "FAILED", process="p2")
    # k3: RETRY_SAME_KEY: an UNKNOWN attempt, then a second one that succeeds.
    s.allow("k3", "a3", "e3", tool=CHARGE, estimate=est, process="p3")
    s.dispatch("a3", process="p3")
    s.outcome("a3", "UNKNOWN", process="p3")
    s.allow("k3", "a3b", "e3", tool=CHARGE, estimate=est, process="p3")
    s.dispatch("a3b", process="p3")
    s.outcome("a3b", "SUCCEEDED", receipt="r3", process="p3")
    s.budget_read(60, 0)  # the shared key's success settles a3 too and releases its money
    # k4: released, then allowed again; the outcome's answer is lost and retried.
    s.allow("k4", "a4", "e4", estimate=est, process="p4")
    s.release("a4", process="p4")
    s.allow("k4", "a4b", "e4", estimate=est, process="p4")
    s.dispatch("a4b", process="p4")
    s.outcome("a4b", "SUCCEEDED", receipt="r4", result="info", process="p4")
    s.outcome("a4b", "SUCCEEDED", receipt="r4", changed=False, process="p4")
    s.budget_read(90, 0)
    read = final(
        effect("e1", "k1", "SUCCEEDED", attempt("a1", 1, "SUCCEEDED", "r1"), receipt="r1"),
        effect("e2", "k2", "FAILED", attempt("a2x", 1, "FAILED"), attempt("a2", 2, "FAILED")),
        effect(
            "e3",
            "k3",
            "SUCCEEDED",
            attempt("a3", 1, "SUCCEEDED", "r3"),
            attempt("a3b", 2, "SUCCEEDED", "r3"),
            tool=CHARGE,
            receipt="r3",
        ),
        effect(
            "e4", "k4", "SUCCEEDED", attempt("a4", 1, "RELEASED"), attempt("a4b", 2, "SUCCEEDED", "r4"), receipt="r4"
        ),
    )
    return s, read


def test_a_clean_history_passes_every_check():
    s, read = clean_history()
    assert check_all(s.h, contracts=CONTRACTS, final=read, budget_limits={"usd_micros": 150}) == []
    # The model sees that a1, a3b and a4b hold 90 for good (a3's money went with the shared key).
    assert len(check_budget_model(s.h, {"usd_micros": 89})) == 1
    assert check_all(s.h, contracts=CONTRACTS) == []  # without the final read too


def test_the_recorder_pairs_calls_and_counts_a_missing_completion_as_info():
    h = History()
    first = h.invoke("p1", OUTCOME, tenant=TENANT, key="k", attempt_id="a1", outcome="FAILED")
    second = h.invoke("p2", DISPATCH, tenant=TENANT, attempt_id="a2")
    done = h.ok(first, stage="FAILED")
    assert (done.invoke, done.key, done.attempt_id, done.outcome) == (first.index, "k", "a1", "FAILED")
    calls = calls_of(h)
    assert [(c.invoke.index, c.type) for c in calls] == [(first.index, "ok"), (second.index, "info")]
    assert calls[0].end == done.index and calls[1].end == float("inf")
    assert h.counts() == {"invoke": 2, "ok": 1}


@pytest.mark.parametrize(
    ("code", "from_service", "kind"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, False, "fail"),
        (grpc.StatusCode.FAILED_PRECONDITION, True, "fail"),
        (grpc.StatusCode.NOT_FOUND, True, "fail"),
        (grpc.StatusCode.PERMISSION_DENIED, True, "fail"),
        (grpc.StatusCode.UNAUTHENTICATED, True, "fail"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, False, "fail"),
        (grpc.StatusCode.UNAVAILABLE, True, "fail"),
        (grpc.StatusCode.ABORTED, True, "fail"),
        (grpc.StatusCode.UNAVAILABLE, False, "info"),
        (grpc.StatusCode.ABORTED, False, "info"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True, "info"),
        (grpc.StatusCode.CANCELLED, False, "info"),
        (grpc.StatusCode.INTERNAL, True, "info"),
        (grpc.StatusCode.UNKNOWN, False, "info"),
    ],
)
def test_errors_are_definite_only_when_the_status_says_nothing_was_applied(code, from_service, kind):
    assert classify_status(code, from_service) == kind


# --- no ALLOW after SUCCEEDED -----------------------------------------------------------------


def test_allow_after_an_acknowledged_success_is_reported():
    s = Script()
    first = s.allow("k", "a1", "e1")
    success = s.outcome("a1", "SUCCEEDED", receipt="r1")
    again = s.allow("k", "a2", "e1", process="p2")
    v = only(check_no_allow_after_success(s.h), "no_allow_after_success")
    assert v.indices == indices(success, again)
    assert first[1].index not in v.indices


def test_allow_after_a_duplicate_answer_is_reported():
    s = Script()
    s.allow("k", "a1", "e1")
    s.outcome("a1", "SUCCEEDED", receipt="r1", result="info")
    duplicate = s.authorize("k", "DUPLICATE", effect="e1", receipt="r1", process="p2")
    again = s.allow("k", "a2", "e1", process="p3")
    v = only(check_no_allow_after_success(s.h), "no_allow_after_success")
    assert v.indices == indices(duplicate, again)


def test_allow_concurrent_with_the_success_is_not_a_violation():
    s = Script()
    s.allow("k", "a1", "e1")
    report = s.begin(OUTCOME, attempt_id="a1", outcome="SUCCEEDED", receipt="r1")
    s.allow("k", "a2", "e1", process="p2")  # invoked and answered while the report is in flight
    s.ok(report, stage="SUCCEEDED", receipt="r1")
    assert check_no_allow_after_success(s.h) == []


# --- one attempt that may take effect at a time -------------------------------------------------


def test_a_second_allow_while_the_first_may_have_happened_is_reported():
    s = Script()
    first = s.allow("k", "a1", "e1")
    s.dispatch("a1")
    s.outcome("a1", "UNKNOWN")
    second = s.allow("k", "a2", "e1", process="p2")
    v = only(check_single_live_attempt(s.h, CONTRACTS), "single_live_attempt")
    assert v.indices == indices(first, second)
    assert "a2" in v.message and "a1" in v.message


@pytest.mark.parametrize("how", ["acknowledged FAILED", "reconciled not_happened", "released"])
def test_a_second_allow_after_a_definite_failure_is_fine(how):
    s = Script()
    s.allow("k", "a1", "e1")
    if how == "acknowledged FAILED":
        s.dispatch("a1")
        s.outcome("a1", "FAILED")
    elif how == "reconciled not_happened":
        s.reconcile("e1", False, {"a1": "FAILED"}, key="k")
    else:
        s.release("a1")
    s.allow("k", "a2", "e1")
    assert check_single_live_attempt(s.h, CONTRACTS) == []


def test_retry_same_key_contracts_may_have_two_live_attempts():
    s = Script()
    s.allow("k", "a1", "e1", tool=CHARGE)
    s.outcome("a1", "UNKNOWN")
    s.allow("k", "a2", "e1", tool=CHARGE)
    assert check_single_live_attempt(s.h, CONTRACTS) == []
    assert check_single_live_attempt(s.h, {CHARGE: ()}) != []  # the same history, another contract


def test_a_failure_invoked_only_after_the_second_allow_was_answered_does_not_excuse_it():
    s = Script()
    first = s.allow("k", "a1", "e1")
    second = s.allow("k", "a2", "e1", process="p2")
    s.outcome("a1", "FAILED")
    v = only(check_single_live_attempt(s.h, CONTRACTS), "single_live_attempt")
    assert v.indices == indices(first, second)


def test_an_indeterminate_failure_excuses_unless_the_final_read_shows_it_never_applied():
    s = Script()
    first = s.allow("k", "a1", "e1")
    s.outcome("a1", "FAILED", result="info")
    second = s.allow("k", "a2", "e1")
    assert check_single_live_attempt(s.h, CONTRACTS) == []
    agrees = final(effect("e1", "k", "AUTHORIZED", attempt("a1", 1, "FAILED"), attempt("a2", 2, "AUTHORIZED")))
    assert check_single_live_attempt(s.h, CONTRACTS, agrees) == []
    contradicts = final(effect("e1", "k", "UNKNOWN", attempt("a1", 1, "UNKNOWN"), attempt("a2", 2, "AUTHORIZED")))
    v = only(check_single_live_attempt(s.h, CONTRACTS, contradicts), "single_live_attempt")
    assert v.indices == indices(first, second)


def test_an_allow_while_a_lost_allows_attempt_is_live_shows_in_the_final_read():
    s = Script()
    s.authorize("k", "ALLOW", result="info")  # created attempt ax; its answer was lost
    later = s.allow("k", "a2", "e1", process="p2")
    s.dispatch("a2", process="p2")
    s.outcome("a2", "FAILED", process="p2")
    assert check_single_live_attempt(s.h, CONTRACTS) == []  # the history alone cannot show it
    live = final(effect("e1", "k", "UNKNOWN", attempt("ax", 1, "UNKNOWN"), attempt("a2", 2, "FAILED")))
    v = only(check_single_live_attempt(s.h, CONTRACTS, live), "single_live_attempt")
    assert v.indices == indices(later)
    assert "ax" in v.message and "UNKNOWN" in v.message
    settled = final(effect("e1", "k", "FAILED", attempt("ax", 1, "FAILED"), attempt("a2", 2, "FAILED")))
    assert check_single_live_attempt(s.h, CONTRACTS, settled) == []
    assert check_single_live_attempt(s.h, {MAIL: ("RETRY_SAME_KEY",)}, live) == []


def test_concurrent_allows_answered_in_the_other_order_than_created_are_fine():
    s = Script()
    slow = s.begin(AUTHORIZE, "p2", key="k", tool=MAIL, digest=DIGEST, value={"estimate": {}})
    s.reconcile("e1", False, {"b1": "FAILED"}, key="k", process="p3")  # b1 exists, and is settled
    s.allow("k", "a1", "e1")  # created after b1 failed; answered first
    s.ok(slow, outcome="ALLOW", attempt_id="b1", effect_id="e1", digest=DIGEST, stage="AUTHORIZED")
    assert check_single_live_attempt(s.h, CONTRACTS) == []
    read = final(effect("e1", "k", "AUTHORIZED", attempt("b1", 1, "FAILED"), attempt("a1", 2, "AUTHORIZED")))
    assert check_single_live_attempt(s.h, CONTRACTS, read) == []
    assert check_all(s.h, contracts=CONTRACTS, final=read) == []


def test_an_effect_that_ends_with_two_live_attempts_is_reported():
    s = Script()
    first = s.allow("k", "a1", "e1")
    s.authorize("k", "ALLOW", result="info", process="p2")
    second = s.allow("k", "a3", "e1", process="p3")
    read = final(
        effect(
            "e1",
            "k",
            "UNKNOWN",
            attempt("a1", 1, "UNKNOWN"),
            attempt("a2", 2, "FAILED"),
            attempt("a3", 3, "SUCCEEDED", "r"),
        ),
    )
    v = only(check_final_attempts(read, CONTRACTS, s.h), "single_live_attempt")
    assert v.indices == indices(first, second)
    assert "a1" in v.message and "a3" in v.message and "a2" not in v.message
    same_key = final(
        effect("e2", "k2", "UNKNOWN", attempt("b1", 1, "UNKNOWN"), attempt("b2", 2, "UNKNOWN"), tool=CHARGE)
    )
    assert check_final_attempts(same_key, CONTRACTS) == []


# --- one intent per key -------------------------------------------------------------------------


def test_an_allow_for_another_intent_on_a_bound_key_is_reported():
    s = Script()
    binder = s.allow("k", "a1", "e1", digest=DIGEST)
    s.outcome("a1", "FAILED")
    s.authorize("k", "DENY", result="fail", digest=OTHER_DIGEST)  # IDEMPOTENCY_KEY_REUSED: fine
    other = s.allow("k", "a2", "e1", digest=OTHER_DIGEST, process="p2")
    v = only(check_intent_binding(s.h), "intent_binding")
    assert v.indices == indices(binder, other)
    # With the final read as the binding, the same ALLOW is named.
    read = final(effect("e1", "k", "AUTHORIZED", attempt("a1", 1, "FAILED"), attempt("a2", 2, "AUTHORIZED")))
    v = only(check_intent_binding(s.h, read), "intent_binding")
    assert indices(other) <= v.indices


def test_an_answer_for_another_digest_than_asked_is_reported():
    s = Script()
    wrong = s.authorize("k", "RECONCILE_REQUIRED", effect="e1", digest=DIGEST, answered_digest=OTHER_DIGEST)
    v = only(check_intent_binding(s.h), "intent_binding")
    assert v.indices == indices(wrong)


# --- receipts ---------------------------------------------------------------------------------


def test_a_receipt_no_client_sent_is_reported():
    s = Script()
    s.allow("k", "a1", "e1")
    s.outcome("a1", "SUCCEEDED", receipt="r1")
    forged = s.authorize("k", "DUPLICATE", effect="e1", receipt="r-forged", process="p2")
    v = only(check_receipts(s.h), "receipts")
    assert v.indices == indices(forged)
    assert "r-forged" in v.message


def test_a_receipt_sent_for_another_key_is_reported():
    s = Script()
    s.allow("k", "a1", "e1")
    s.outcome("a1", "SUCCEEDED", receipt="r1")
    s.allow("k2", "b1", "e2")
    s.dispatch("b1")
    wrong = s.read("e2", "SUCCEEDED", {"b1": "SUCCEEDED"}, key="k2", receipt="r1")
    v = only(check_receipts(s.h), "receipts")
    assert v.indices == indices(wrong)


def test_an_outcome_for_an_attempt_never_allowed_is_reported():
    s = Script()
    s.allow("k", "a1", "e1")
    stray = s.outcome("a-never", "SUCCEEDED", receipt="r1", key="k")
    v = only(check_receipts(s.h), "receipts")
    assert v.indices == indices(stray)
    assert "a-never" in v.message


def test_a_receipt_on_an_attempt_only_a_lost_allow_explains():
    def history(lost_allow: bool) -> History:
        s = Script()
        if lost_allow:
            s.authorize("k", "ALLOW", tool=CHARGE, result="info", process="p2")
        s.allow("k", "a1", "e1", tool=CHARGE)
        s.dispatch("a1")
        s.reconcile("e1", True, {"a1": "SUCCEEDED", "ax": "SUCCEEDED"}, key="k", receipt="r1")
        return s.h

    read = final(
        effect(
            "e1",
            "k",
            "SUCCEEDED",
            attempt("ax", 1, "SUCCEEDED", "r1"),
            attempt("a1", 2, "SUCCEEDED", "r1"),
            tool=CHARGE,
            receipt="r1",
        )
    )
    v = only(check_receipts(history(lost_allow=False), read), "receipts")
    assert "ax" in v.message
    # One indeterminate AuthorizeEffect of the key could have created it.
    assert check_receipts(history(lost_allow=True), read) == []


# --- budgets ----------------------------------------------------------------------------------


def test_a_budget_sample_over_its_limit_is_reported():
    s = Script()
    s.budget_read(40, 60, limit=100)
    over = s.budget_read(50, 60, limit=100)
    v = only(check_budget_samples(s.h), "budget")
    assert v.indices == indices(over)


def test_the_budget_model_reports_more_held_than_the_limit():
    s = Script()
    est = {"usd_micros": 40}
    allows = []
    for n in range(3):
        allows.append(s.allow(f"k{n}", f"a{n}", f"e{n}", estimate=est))
        s.dispatch(f"a{n}")
    v = only(check_budget_model(s.h, {"usd_micros": 100}), "budget")
    assert v.indices == indices(*allows)
    assert "120" in v.message


def test_the_budget_model_lets_go_of_what_may_have_been_voided_or_expired():
    s = Script()
    est = {"usd_micros": 40}
    s.allow("k0", "a0", "e0", estimate=est)
    s.dispatch("a0")
    s.allow("k1", "a1", "e1", estimate=est)
    s.dispatch("a1")
    s.outcome("a1", "FAILED", result="info")  # may have voided a1
    s.allow("k2", "a2", "e2", estimate=est)
    s.dispatch("a2")
    s.allow("k3", "a3", "e3", estimate=est)  # never dispatched: its lease may have run out
    s.allow("k4", "a4", "e4", estimate=est)
    assert check_budget_model(s.h, {"usd_micros": 100}) == []
    s.dispatch("a4")  # now a0, a2 and a4 are held for good
    assert len(check_budget_model(s.h, {"usd_micros": 100})) == 1


# --- acknowledged writes ------------------------------------------------------------------------


def test_an_acknowledged_allow_missing_afterwards_is_reported():
    s = Script()
    kept = s.allow("k", "a1", "e1")
    lost = s.allow("k2", "b1", "e2")
    read = final(
        effect("e1", "k", "AUTHORIZED", attempt("a1", 1, "AUTHORIZED")),
        effect("e2", "k2", "FAILED", attempt("b0", 1, "FAILED")),
    )
    v = only(check_acknowledged_writes(s.h, read), "acknowledged_writes")
    assert v.indices == indices(lost) and "b1" in v.message
    assert not v.indices & indices(kept)


def test_an_acknowledged_outcome_contradicted_afterwards_is_reported():
    s = Script()
    s.allow("k", "a1", "e1")
    s.dispatch("a1")
    success = s.outcome("a1", "SUCCEEDED", receipt="r1")
    s.allow("k2", "b1", "e2")
    failure = s.outcome("b1", "FAILED")
    read = final(
        effect("e1", "k", "FAILED", attempt("a1", 1, "FAILED")),
        effect("e2", "k2", "FAILED", attempt("b1", 1, "FAILED")),
    )
    v = only(check_acknowledged_writes(s.h, read), "acknowledged_writes")
    assert v.indices == indices(success)
    assert not v.indices & indices(failure)
    other_receipt = final(
        effect("e1", "k", "SUCCEEDED", attempt("a1", 1, "SUCCEEDED", "r2"), receipt="r2"),
        effect("e2", "k2", "FAILED", attempt("b1", 1, "FAILED")),
    )
    v = only(check_acknowledged_writes(s.h, other_receipt), "acknowledged_writes")
    assert v.indices == indices(success) and "r2" in v.message


def test_an_acknowledged_unknown_may_end_settled_but_never_open_again():
    s = Script()
    s.allow("k", "a1", "e1")
    s.dispatch("a1")
    unknown = s.outcome("a1", "UNKNOWN")
    settled = final(effect("e1", "k", "SUCCEEDED", attempt("a1", 1, "SUCCEEDED", "r1"), receipt="r1"))
    assert check_acknowledged_writes(s.h, settled) == []
    reopened = final(effect("e1", "k", "DISPATCHED", attempt("a1", 1, "DISPATCHED")))
    v = only(check_acknowledged_writes(s.h, reopened), "acknowledged_writes")
    assert v.indices == indices(unknown)


# --- stage transitions ------------------------------------------------------------------------


def sequence(*stages: str) -> list[Observation]:
    return [Observation(stage, n, n) for n, stage in enumerate(stages)]


def test_observed_stages_that_skip_edges_pass_and_a_regression_is_reported():
    assert check_stage_transitions({"a": sequence("AUTHORIZED", "DISPATCHED", "UNKNOWN", "SUCCEEDED")}) == []
    assert check_stage_transitions({"a": sequence("AUTHORIZED", "FAILED", "FAILED")}) == []
    v = only(check_stage_transitions({"a": sequence("AUTHORIZED", "UNKNOWN", "DISPATCHED")}), "stage_transitions")
    assert "UNKNOWN -> DISPATCHED" in v.message
    v = only(check_stage_transitions({"a": sequence("RELEASED", "SUCCEEDED")}), "stage_transitions")
    assert "RELEASED -> SUCCEEDED" in v.message
    v = only(check_stage_transitions({"a": sequence("AUTHORIZED", "BOGUS")}), "stage_transitions")
    assert "BOGUS" in v.message


def test_a_stage_regression_in_the_answers_is_reported_with_both_calls():
    s = Script()
    s.allow("k", "a1", "e1")
    success = s.outcome("a1", "SUCCEEDED", receipt="r1")
    regressed = s.dispatch("a1", process="p2")  # answered DISPATCHED after SUCCEEDED
    v = only(check_stage_transitions(observed_stages(s.h)), "stage_transitions")
    assert v.indices == indices(success, regressed)
    assert "SUCCEEDED -> DISPATCHED" in v.message


def test_concurrent_observations_are_not_ordered():
    s = Script()
    s.allow("k", "a1", "e1")
    dispatch = s.begin(DISPATCH, attempt_id="a1", outcome="DISPATCHED")
    s.outcome("a1", "SUCCEEDED", receipt="r1", process="p2")
    s.ok(dispatch, stage="DISPATCHED")  # answered last, but applied first
    assert check_stage_transitions(observed_stages(s.h)) == []
    # The final read comes after everything.
    read = final(effect("e1", "k", "DISPATCHED", attempt("a1", 1, "DISPATCHED")))
    v = only(check_stage_transitions(observed_stages(s.h, read)), "stage_transitions")
    assert "SUCCEEDED -> DISPATCHED" in v.message


def test_a_commit_whose_outcome_is_unknown_is_indeterminate():
    assert classify_status(grpc.StatusCode.UNAVAILABLE, True, "COMMIT_OUTCOME_UNKNOWN") == "info"
    assert classify_status(grpc.StatusCode.UNAVAILABLE, True, "STORAGE_UNAVAILABLE") == "fail"


# --- an attempt shown UNKNOWN is never revived ----------------------------------------------


def lease_expired_refusal(s: Script, f: str, attempt: str, process: str = "p1"):
    """A dispatch or renewal refused because the lease had run out (the attempt is UNKNOWN)."""
    invoke = s.begin(f, process, attempt_id=attempt, outcome="DISPATCHED" if f == DISPATCH else "")
    return invoke, s.fail(
        invoke,
        error="FAILED_PRECONDITION LEASE_EXPIRED: the lease ran out",
        value={
            "code": "FAILED_PRECONDITION",
            "reason": "LEASE_EXPIRED",
            "metadata": {"attempt_id": attempt, "stage": "UNKNOWN"},
        },
    )


def test_a_dispatch_that_revives_an_attempt_a_read_showed_unknown_is_reported():
    # The chaos run's double send: a read after the lease's end shows UNKNOWN, a reconciler acts
    # on it, and then the dispatch that waited for the lock is answered DISPATCHED.
    s = Script()
    s.allow("k", "a1", "e1")
    read = s.read("e1", "UNKNOWN", {"a1": "UNKNOWN"}, key="k")
    revived = s.dispatch("a1", process="p2")
    v = only(check_unknown_never_revived(s.h), "unknown_never_revived")
    assert v.indices == indices(read, revived)
    assert "a1" in v.message and "DISPATCHED" in v.message
    assert "unknown_never_revived" in [x.property for x in check_all(s.h, contracts=CONTRACTS)]


def test_a_list_that_shows_an_attempt_authorized_after_a_report_showed_it_unknown_is_reported():
    s = Script()
    s.allow("k", "a1", "e1")
    unknown = s.outcome("a1", "UNKNOWN")
    listed_invoke = s.begin(READ, "reconciler", value={"run_id": "r1"})
    listed = (
        listed_invoke,
        s.ok(
            listed_invoke,
            value={"run_id": "r1", "effects": {"e1": "AUTHORIZED"}, "attempts": {"a1": "AUTHORIZED", "b1": "UNKNOWN"}},
        ),
    )
    v = only(check_unknown_never_revived(s.h), "unknown_never_revived")
    assert v.indices == indices(unknown, listed)


def test_a_lease_expired_refusal_counts_as_shown_unknown():
    s = Script()
    s.allow("k", "a1", "e1")
    refused = lease_expired_refusal(s, DISPATCH, "a1")
    renewed_invoke = s.begin(RENEW, "p2", attempt_id="a1")
    renewed = (renewed_invoke, s.ok(renewed_invoke, stage="DISPATCHED"))
    v = only(check_unknown_never_revived(s.h), "unknown_never_revived")
    assert v.indices == indices(refused, renewed)
    # Another refusal names no stage: it shows nothing.
    t = Script()
    t.allow("k", "a1", "e1")
    other = t.begin(DISPATCH, attempt_id="a1", outcome="DISPATCHED")
    t.fail(
        other,
        error="FAILED_PRECONDITION ATTEMPT_RELEASED",
        value={"code": "FAILED_PRECONDITION", "reason": "ATTEMPT_RELEASED", "metadata": {"attempt_id": "a1"}},
    )
    t.dispatch("a1", process="p2")
    assert check_unknown_never_revived(t.h) == []


def test_the_final_read_cannot_revive_an_unknown_attempt():
    s = Script()
    s.allow("k", "a1", "e1")
    read = s.read("e1", "UNKNOWN", {"a1": "UNKNOWN"}, key="k")
    revived = final(effect("e1", "k", "DISPATCHED", attempt("a1", 1, "DISPATCHED")))
    v = only(check_unknown_never_revived(s.h, revived), "unknown_never_revived")
    assert v.indices == indices(read) and "final read" in v.message
    settled = final(effect("e1", "k", "FAILED", attempt("a1", 1, "FAILED")))
    assert check_unknown_never_revived(s.h, settled) == []


def test_unknown_then_settled_and_answers_concurrent_with_the_unknown_one_are_legal():
    s = Script()
    s.allow("k", "a1", "e1")
    # A dispatch in flight while a read shows UNKNOWN may have taken effect first: not ordered.
    dispatch = s.begin(DISPATCH, "p1", attempt_id="a1", outcome="DISPATCHED")
    s.read("e1", "UNKNOWN", {"a1": "UNKNOWN"}, key="k")
    s.ok(dispatch, stage="DISPATCHED")
    # A dispatch invoked later but never answered shows nothing.
    s.dispatch("a1", process="p3", result="info")
    # The reconciler settles it; a new attempt of the key is AUTHORIZED, not a revival.
    s.reconcile("e1", False, {"a1": "FAILED"}, key="k", process="reconciler")
    s.allow("k", "a2", "e1", process="p2")
    s.dispatch("a2", process="p2")
    s.read("e1", "DISPATCHED", {"a1": "FAILED", "a2": "DISPATCHED"}, key="k")
    s.outcome("a2", "SUCCEEDED", receipt="r2", process="p2")
    read = final(
        effect("e1", "k", "SUCCEEDED", attempt("a1", 1, "FAILED"), attempt("a2", 2, "SUCCEEDED", "r2"), receipt="r2")
    )
    assert check_unknown_never_revived(s.h, read) == []
    assert check_all(s.h, contracts=CONTRACTS, final=read) == []


def test_the_clean_history_shows_no_revival():
    s, read = clean_history()
    assert check_unknown_never_revived(s.h, read) == []


def at(pair, invoked: float, answered: float):
    """Set the real times (seconds) of a call's invoke and completion."""
    pair[0].time, pair[1].time = invoked, answered
    return pair


def test_a_lease_restart_concurrent_with_an_unknown_answer_is_reported_when_leases_are_known():
    # The chaos run's history: the dispatch waits for the lock across the lease's end; a read
    # shows UNKNOWN meanwhile; the dispatch is then answered DISPATCHED. Either order is wrong:
    # after the read it revived the attempt, before it its new lease (2 s) could not have run out.
    s = Script()
    at(s.allow("k", "a1", "e1"), 0.0, 0.05)
    dispatch_invoke = s.begin(DISPATCH, "p1", attempt_id="a1", outcome="DISPATCHED")
    read = at(s.read("e1", "UNKNOWN", {"a1": "UNKNOWN"}, key="k"), 1.98, 2.04)
    dispatch = at((dispatch_invoke, s.ok(dispatch_invoke, stage="DISPATCHED", value={"changed": True})), 1.96, 2.10)
    leases = {MAIL: 2.0}
    assert check_unknown_never_revived(s.h) == []  # real-time order alone allows it
    v = only(check_unknown_never_revived(s.h, leases=leases), "unknown_never_revived")
    assert v.indices == indices(read, dispatch)
    assert "dispatch" in v.message and "DISPATCHED" in v.message
    assert [x.property for x in check_all(s.h, contracts=CONTRACTS, leases=leases)] == ["unknown_never_revived"]


def test_a_renewal_counts_as_a_lease_restart_and_an_echo_does_not():
    s = Script()
    at(s.allow("k", "a1", "e1"), 0.0, 0.05)
    at(s.dispatch("a1"), 0.1, 0.15)
    renew_invoke = s.begin(RENEW, "p1", attempt_id="a1")
    renewed = at((renew_invoke, s.ok(renew_invoke, stage="DISPATCHED")), 2.0, 2.05)
    refused = at(lease_expired_refusal(s, RENEW, "a1", process="p2"), 2.5, 2.55)
    v = only(check_unknown_never_revived(s.h, leases={MAIL: 2.0}), "unknown_never_revived")
    assert v.indices == indices(refused, renewed)
    t = Script()
    at(t.allow("k", "a1", "e1"), 0.0, 0.05)
    at(t.dispatch("a1", changed=False), 1.9, 1.95)  # an echo: no new lease
    at(t.read("e1", "UNKNOWN", {"a1": "UNKNOWN"}, key="k"), 2.0, 2.05)
    assert check_unknown_never_revived(t.h, leases={MAIL: 2.0}) == []


def test_unknown_a_lease_after_the_restart_or_reported_unknown_is_legal():
    s = Script()
    at(s.allow("k", "a1", "e1"), 0.0, 0.05)
    at(s.dispatch("a1"), 0.1, 0.15)
    at(s.read("e1", "UNKNOWN", {"a1": "UNKNOWN"}, key="k"), 2.1, 2.15)  # the lease ran out: fine
    assert check_unknown_never_revived(s.h, leases={MAIL: 2.0}) == []
    t = Script()
    at(t.allow("k", "a1", "e1"), 0.0, 0.05)
    at(t.dispatch("a1"), 0.1, 0.15)
    at(t.outcome("a1", "UNKNOWN", result="info"), 0.2, 0.25)  # the runtime said so (maybe)
    at(t.read("e1", "UNKNOWN", {"a1": "UNKNOWN"}, key="k"), 0.3, 0.35)
    assert check_unknown_never_revived(t.h, leases={MAIL: 2.0}) == []
    assert check_unknown_never_revived(t.h, leases={CHARGE: 2.0}) == []  # no lease known for the tool
