"""The gate's reads and writes on PostgreSQL, without the ORM: one round trip each way.

AuthorizeEffect on PostgreSQL is two round trips: ``el_authorize_facts`` (sent with the
transaction's BEGIN) gathers every fact the decision needs, with the effect bound to the key
locked before its attempts are read and before the clock is read; the server then decides; and
``el_apply`` (sent with the COMMIT) writes everything the decision implies: the effect, the
attempt, the decision, the budget reservations and the trace events, each event's hash computed
under the run row's lock from the head it extends. A reservation that does not fit turns the
decision into DENY inside the same statement. The rows many callers share (budget counters, the
run row) are locked by the last statements before COMMIT, so each caller holds them for the
least time. The functions are created by migrations (0006 first); their text lives here, beside
the code that calls them. Lock order is the ledger's everywhere: the effect row, then budget
rows, then the run row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from effect_ledger import faults
from effect_ledger.domain.budgets import Budget, Scope
from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.model import (
    Attempt,
    Decision,
    Effect,
    EffectClass,
    FailureEvidence,
    Principal,
    Receipt,
    Recovery,
    Role,
    Run,
    Stage,
    ToolContract,
)
from effect_ledger.domain.trace import timestamp_text
from effect_ledger.errors import CommitOutcomeUnknown
from effect_ledger.storage import round_trips

FACTS_FUNCTION = """
CREATE OR REPLACE FUNCTION el_authorize_facts(
    p_token_hash text, p_run_id text, p_key text, p_tool text, p_target text,
    p_open_limit integer, p_target_limit integer, p_dimensions boolean
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    v_principal principals%ROWTYPE;
    v_run runs%ROWTYPE;
    v_effect effects%ROWTYPE;
    v_effect_id text;
    v_now timestamptz;
BEGIN
    SELECT * INTO v_principal FROM principals WHERE token_hash = p_token_hash AND disabled_at IS NULL
        AND (token_expires_at IS NULL OR token_expires_at > clock_timestamp());
    IF NOT FOUND THEN
        RETURN jsonb_build_object('principal', NULL);
    END IF;
    SELECT * INTO v_run FROM runs WHERE tenant_id = v_principal.tenant_id AND run_id = p_run_id;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('principal', to_jsonb(v_principal) - 'token_hash', 'run', NULL);
    END IF;
    -- A SUCCEEDED effect never changes its answer (DUPLICATE): read without a lock, so that
    -- retries of a settled key do not queue on its row.
    SELECT * INTO v_effect FROM effects WHERE tenant_id = v_principal.tenant_id AND idempotency_key = p_key;
    IF FOUND AND v_effect.stage = 'SUCCEEDED' THEN
        v_effect_id := v_effect.effect_id;
    ELSE
        -- The effect bound to the key: locked first, then read (a statement of its own, so the
        -- read sees everything the previous holder committed), then the clock: a lease is judged
        -- by a time no earlier than the moment the lock was granted.
        SELECT effect_id INTO v_effect_id FROM effects
            WHERE tenant_id = v_principal.tenant_id AND idempotency_key = p_key FOR UPDATE;
        IF v_effect_id IS NOT NULL THEN
            SELECT * INTO v_effect FROM effects WHERE tenant_id = v_principal.tenant_id AND effect_id = v_effect_id;
        END IF;
    END IF;
    v_now := clock_timestamp();
    RETURN jsonb_build_object(
        'principal', to_jsonb(v_principal) - 'token_hash',
        'now', v_now,
        'run', to_jsonb(v_run),
        'effect', CASE WHEN v_effect_id IS NULL THEN NULL ELSE to_jsonb(v_effect) END,
        'attempts', COALESCE((
            SELECT jsonb_agg(to_jsonb(a) ORDER BY a.number) FROM attempts a
            WHERE v_effect_id IS NOT NULL AND a.tenant_id = v_principal.tenant_id AND a.effect_id = v_effect_id
        ), '[]'::jsonb),
        'current', (
            SELECT to_jsonb(c) FROM tool_contracts c
            WHERE c.tenant_id = v_principal.tenant_id AND c.tool = p_tool ORDER BY c.revision DESC LIMIT 1
        ),
        'pinned', (
            SELECT to_jsonb(c) FROM tool_contracts c
            WHERE v_effect_id IS NOT NULL AND c.tenant_id = v_principal.tenant_id
              AND c.tool = v_effect.tool AND c.revision = v_effect.tool_revision
        ),
        'obligations', COALESCE((
            SELECT jsonb_agg(o.effect_id ORDER BY o.effect_id) FROM (
                SELECT r.effect_id FROM resume_obligations r
                JOIN effects e ON e.tenant_id = r.tenant_id AND e.effect_id = r.effect_id
                WHERE r.tenant_id = v_principal.tenant_id AND r.run_id = p_run_id
                  AND e.stage IN ('AUTHORIZED', 'DISPATCHED', 'UNKNOWN')
                ORDER BY r.effect_id LIMIT 50
            ) o
        ), '[]'::jsonb),
        'budgets', COALESCE((
            SELECT jsonb_agg(to_jsonb(b) ORDER BY b.budget_id) FROM budgets b
            WHERE b.tenant_id = v_principal.tenant_id AND (
                b.scope = 'TENANT'
                OR (b.scope = 'RUN' AND b.scope_id = p_run_id)
                OR (b.scope = 'RUN_TREE' AND b.scope_id = v_run.root_run_id))
        ), '[]'::jsonb),
        'run_open', COALESCE((
            SELECT jsonb_agg(jsonb_build_object(
                'effect_id', x.effect_id, 'tool', x.tool, 'target', x.target, 'stage', x.stage) ORDER BY x.effect_id)
            FROM (
                SELECT effect_id, tool, target, stage FROM effects
                WHERE tenant_id = v_principal.tenant_id AND run_id = p_run_id
                  AND stage IN ('AUTHORIZED', 'DISPATCHED', 'UNKNOWN')
                ORDER BY effect_id LIMIT p_open_limit
            ) x
        ), '[]'::jsonb),
        'on_target', COALESCE((
            SELECT jsonb_agg(jsonb_build_object(
                'effect_id', x.effect_id, 'run_id', x.run_id, 'idempotency_key', x.idempotency_key) ORDER BY x.effect_id)
            FROM (
                SELECT effect_id, run_id, idempotency_key FROM effects
                WHERE tenant_id = v_principal.tenant_id AND tool = p_tool AND target = p_target AND stage = 'UNKNOWN'
                ORDER BY effect_id LIMIT p_target_limit
            ) x
        ), '[]'::jsonb),
        'approvals', EXISTS (
            SELECT 1 FROM approvals
            WHERE tenant_id = v_principal.tenant_id AND run_id = p_run_id AND tool = p_tool
        ),
        'scheduled', EXISTS (
            SELECT 1 FROM schedules
            WHERE tenant_id = v_principal.tenant_id AND idempotency_key = p_key AND state IN ('SCHEDULED', 'DUE')
        ),
        'dimensions', CASE WHEN p_dimensions THEN COALESCE((
            SELECT jsonb_agg(DISTINCT dimension) FROM budgets WHERE tenant_id = v_principal.tenant_id
        ), '[]'::jsonb) END
    );
END
$fn$;
"""

INSERT_DECISION_FUNCTION = """
CREATE OR REPLACE FUNCTION el_insert_decision(p_decision jsonb, p_input bytea) RETURNS void LANGUAGE sql AS $fn$
    INSERT INTO decisions (tenant_id, decision_id, run_id, effect_id, attempt_id, outcome, reasons, policy_revision,
                           engine, input_digest, input_json, intent_digest, idempotency_key, principal_id, tool, created_at)
    SELECT d.tenant_id, d.decision_id, d.run_id, d.effect_id, d.attempt_id, d.outcome, d.reasons, d.policy_revision,
           d.engine, d.input_digest, p_input, d.intent_digest, d.idempotency_key, d.principal_id, d.tool, d.created_at
    FROM jsonb_populate_record(NULL::decisions, p_decision) d;
$fn$;
"""

ATTEMPT_FACTS_FUNCTION = """
CREATE OR REPLACE FUNCTION el_attempt_facts(p_token_hash text, p_attempt_id text) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    v_principal principals%ROWTYPE;
    v_effect effects%ROWTYPE;
    v_effect_id text;
    v_now timestamptz;
BEGIN
    SELECT * INTO v_principal FROM principals WHERE token_hash = p_token_hash AND disabled_at IS NULL
        AND (token_expires_at IS NULL OR token_expires_at > clock_timestamp());
    IF NOT FOUND THEN
        RETURN jsonb_build_object('principal', NULL);
    END IF;
    SELECT effect_id INTO v_effect_id FROM attempts
        WHERE tenant_id = v_principal.tenant_id AND attempt_id = p_attempt_id;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('principal', to_jsonb(v_principal) - 'token_hash', 'effect', NULL);
    END IF;
    -- The effect row locked, then read, then the clock (see el_authorize_facts).
    PERFORM 1 FROM effects WHERE tenant_id = v_principal.tenant_id AND effect_id = v_effect_id FOR UPDATE;
    SELECT * INTO v_effect FROM effects WHERE tenant_id = v_principal.tenant_id AND effect_id = v_effect_id;
    v_now := clock_timestamp();
    RETURN jsonb_build_object(
        'principal', to_jsonb(v_principal) - 'token_hash',
        'now', v_now,
        'effect', to_jsonb(v_effect),
        'attempts', COALESCE((
            SELECT jsonb_agg(to_jsonb(a) ORDER BY a.number) FROM attempts a
            WHERE a.tenant_id = v_principal.tenant_id AND a.effect_id = v_effect_id
        ), '[]'::jsonb),
        'pinned', (
            SELECT to_jsonb(c) FROM tool_contracts c
            WHERE c.tenant_id = v_principal.tenant_id AND c.tool = v_effect.tool AND c.revision = v_effect.tool_revision
        ),
        'reservations', COALESCE((
            SELECT jsonb_agg(to_jsonb(r) ORDER BY r.budget_id, r.reservation_id) FROM reservations r
            WHERE r.tenant_id = v_principal.tenant_id AND r.effect_id = v_effect_id AND r.state = 'PENDING'
        ), '[]'::jsonb)
    );
END
$fn$;
"""

APPLY_FUNCTION = """
CREATE OR REPLACE FUNCTION el_apply(p jsonb, p_input bytea) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    v_tenant text := p->>'tenant_id';
    v_run text := p->>'run_id';
    v_now timestamptz := (p->>'now')::timestamptz;
    v_item jsonb;
    v_revision bigint;
    v_hash text;
    v_next text;
BEGIN
    -- A new reservation that does not fit by the committed counters turns the decision into the
    -- DENY the caller prepared, and nothing else is written. This read takes no lock: the shared
    -- counters are locked only at the end (below), so that concurrent callers hold them for the
    -- least time.
    FOR v_item IN SELECT * FROM jsonb_array_elements(COALESCE(p->'reservations', '[]'::jsonb)) LOOP
        PERFORM 1 FROM budgets WHERE tenant_id = v_tenant AND budget_id = v_item->>'budget_id'
            AND posted + pending + (v_item->>'amount')::bigint <= limit_amount;
        IF NOT FOUND THEN
            PERFORM el_insert_decision(jsonb_set(p->'exhausted_decision', '{reasons}', to_jsonb(
                '[{"code":"BUDGET_EXHAUSTED","message":"dimension ' || (v_item->>'dimension')
                || ': the estimate does not fit in the budget"}]')), p_input);
            RETURN jsonb_build_object('exhausted', v_item->>'dimension');
        END IF;
    END LOOP;
    -- Settlements: a reservation ends once (PENDING to its final state); its budget's counters
    -- move at the end.
    FOR v_item IN SELECT * FROM jsonb_array_elements(COALESCE(p->'settlements', '[]'::jsonb)) LOOP
        UPDATE reservations SET state = v_item->>'state', posted_amount = (v_item->>'posted_amount')::bigint,
                                settled_at = v_now
            WHERE tenant_id = v_tenant AND reservation_id = v_item->>'reservation_id' AND state = 'PENDING';
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the reservation was settled concurrently' USING ERRCODE = '40001';
        END IF;
    END LOOP;
    IF p ? 'new_effect' THEN
        INSERT INTO effects SELECT * FROM jsonb_populate_record(NULL::effects, p->'new_effect')
            ON CONFLICT (tenant_id, idempotency_key) DO NOTHING;
        IF NOT FOUND THEN
            -- Another replica bound the key first: the caller runs again and answers from it.
            RAISE EXCEPTION 'the idempotency key was bound concurrently' USING ERRCODE = '40001';
        END IF;
    ELSIF p ? 'effect_state' THEN
        UPDATE effects SET stage = p->'effect_state'->>'stage', updated_at = v_now
            WHERE tenant_id = v_tenant AND effect_id = p->'effect_state'->>'effect_id';
    END IF;
    IF p ? 'attempt' THEN
        INSERT INTO attempts SELECT * FROM jsonb_populate_record(NULL::attempts, p->'attempt');
    END IF;
    -- Each attempt by its key: a join with the update list (a set-returning function the
    -- planner guesses at 100 rows) was planned as a scan of the whole attempts table, whose
    -- cost grew with the table (a soak's cycle rate fell by a third within minutes).
    FOR v_item IN SELECT * FROM jsonb_array_elements(COALESCE(p->'attempt_updates', '[]'::jsonb)) LOOP
        UPDATE attempts a SET stage = r.stage, lease_expires_at = r.lease_expires_at, dispatched_at = r.dispatched_at,
            finished_at = r.finished_at, outcome_reason = r.outcome_reason, failure_evidence = r.failure_evidence,
            receipt_reference = r.receipt_reference, receipt_detail = r.receipt_detail,
            receipt_digest = r.receipt_digest, receipt_recorded_at = r.receipt_recorded_at
        FROM jsonb_populate_record(NULL::attempts, v_item) r
        WHERE a.tenant_id = v_tenant AND a.attempt_id = v_item->>'attempt_id';
    END LOOP;
    INSERT INTO reservations
        SELECT * FROM jsonb_populate_recordset(NULL::reservations, COALESCE(p->'reservation_rows', '[]'::jsonb));
    IF p ? 'decision' THEN
        PERFORM el_insert_decision(p->'decision', p_input);
    END IF;
    -- The budget counters, in budget order, then the run row: the rows many callers share are
    -- locked by the last statements before COMMIT (the ledger's lock order: effect, budgets,
    -- run). A reservation checked against the counters under their lock: when it no longer
    -- fits (a concurrent caller took the room since the check above), the whole transaction is
    -- rolled back and run again, and the check above then answers DENY.
    FOR v_item IN SELECT x FROM jsonb_array_elements(COALESCE(p->'reservations', '[]'::jsonb)) x
                  ORDER BY x->>'budget_id' LOOP
        UPDATE budgets SET pending = pending + (v_item->>'amount')::bigint, updated_at = v_now
            WHERE tenant_id = v_tenant AND budget_id = v_item->>'budget_id'
              AND posted + pending + (v_item->>'amount')::bigint <= limit_amount;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'a reservation no longer fits its budget' USING ERRCODE = '40001';
        END IF;
    END LOOP;
    -- Settled reservations give back their pending amount and post what they post (refused when
    -- the counter would overflow).
    FOR v_item IN SELECT x FROM jsonb_array_elements(COALESCE(p->'settlements', '[]'::jsonb)) x
                  ORDER BY x->>'budget_id' LOOP
        UPDATE budgets SET pending = pending - (v_item->>'amount')::bigint,
                           posted = posted + (v_item->>'posted_amount')::bigint, updated_at = v_now
            WHERE tenant_id = v_tenant AND budget_id = v_item->>'budget_id'
              AND posted <= 9223372036854775807 - (v_item->>'posted_amount')::bigint;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'posting would overflow the budget counter' USING ERRCODE = 'EL002';
        END IF;
    END LOOP;
    IF jsonb_array_length(COALESCE(p->'events', '[]'::jsonb)) > 0 THEN
        -- The run row last; FOR NO KEY UPDATE, as every appender (see trace_store.append_events).
        SELECT revision, head_hash INTO v_revision, v_hash FROM runs
            WHERE tenant_id = v_tenant AND run_id = v_run FOR NO KEY UPDATE;
        FOR v_item IN SELECT * FROM jsonb_array_elements(p->'events') LOOP
            v_revision := v_revision + 1;
            v_next := encode(sha256(convert_to(
                v_hash || E'\\n' || (v_item->>'body_head') || v_revision::text || (v_item->>'body_tail'), 'UTF8')), 'hex');
            INSERT INTO run_events (tenant_id, run_id, revision, type, payload, principal_id, created_at, prev_hash, hash)
            VALUES (v_tenant, v_run, v_revision, v_item->>'type', v_item->>'payload', v_item->>'principal_id', v_now, v_hash, v_next);
            v_hash := v_next;
        END LOOP;
        UPDATE runs SET revision = v_revision, head_hash = v_hash WHERE tenant_id = v_tenant AND run_id = v_run;
    END IF;
    RETURN jsonb_build_object('revision', v_revision);
END
$fn$;
"""

CREATE_FUNCTIONS = (FACTS_FUNCTION, ATTEMPT_FACTS_FUNCTION, INSERT_DECISION_FUNCTION, APPLY_FUNCTION)

DROP_FUNCTIONS = """
DROP FUNCTION IF EXISTS el_apply(jsonb, bytea);
DROP FUNCTION IF EXISTS el_attempt_facts(text, text);
DROP FUNCTION IF EXISTS el_insert_decision(jsonb, bytea);
DROP FUNCTION IF EXISTS el_authorize_facts(text, text, text, text, text, integer, integer, boolean);
"""


def create_functions(op: Any) -> None:
    """For migrations (alembic's ``op``): create the functions above again, on PostgreSQL only.

    A change of their text comes with a new revision that calls this, so a database at head
    always holds the text the code calls.
    """
    if op.get_bind().dialect.name != "postgresql":
        return
    for text in CREATE_FUNCTIONS:
        op.execute(text)


# el_apply's refusal of a posting that would overflow a 64-bit budget counter.
OVERFLOW_SQLSTATE = "EL002"


class CounterOverflow(Exception):
    """A settlement would overflow a budget counter; the transaction is rolled back."""


# Each round trip is one simple-protocol query string holding two statements (BEGIN and the
# read; the write and COMMIT), with the parameters bound on the client: one network exchange and
# no busy pipeline loop. The connection is in autocommit mode for it (``Database.run_driver``),
# so the driver adds no BEGIN of its own.
FACTS_CALL = "BEGIN; SELECT el_authorize_facts(%s, %s, %s, %s, %s, %s, %s, %s)"
ATTEMPT_FACTS_CALL = "BEGIN; SELECT el_attempt_facts(%s, %s)"
APPLY_CALL = "SELECT el_apply(%s::jsonb, %s::bytea)"

# A sentinel revision, replaced by the database with the revision it assigns under the lock.
_REVISION_SENTINEL = 987_654_321_987_654_321


# --- rows from the facts document ------------------------------------------------------------


def _time(value: str | None) -> datetime | None:
    if value is None:
        return None
    return datetime.fromisoformat(value).astimezone(UTC)


def required_time(value: str) -> datetime:
    moment = _time(value)
    assert moment is not None, "a NOT NULL timestamp"
    return moment


def principal_of(row: dict[str, Any]) -> Principal:
    return Principal(
        row["tenant_id"],
        row["principal_id"],
        frozenset(Role(r) for r in json.loads(row["roles"])),
        row.get("client_subject"),
    )


def run_of(row: dict[str, Any]) -> Run:
    return Run(
        tenant_id=row["tenant_id"],
        run_id=row["run_id"],
        created_by=row["created_by"],
        created_at=required_time(row["created_at"]),
        revision=row["revision"],
        head_hash=row["head_hash"],
        labels=json.loads(row["labels"]),
        root_run_id=row["root_run_id"],
        parent_run_id=row["parent_run_id"],
        world=row["world"],
        forked_from_checkpoint=row["forked_from_checkpoint"],
        segment=row["segment"],
        provider=row["provider"],
        model=row["model"],
        adapter=row["adapter"],
    )


def contract_of(row: dict[str, Any] | None) -> ToolContract | None:
    if row is None:
        return None
    schema = row["arguments_schema"]
    return ToolContract(
        tool=row["tool"],
        revision=row["revision"],
        effect_class=EffectClass(row["effect_class"]),
        provider_idempotency=row["provider_idempotency"],
        queryable=row["queryable"],
        allowed_recovery=tuple(Recovery(r) for r in json.loads(row["allowed_recovery"])),
        arguments_schema=json.loads(schema) if schema is not None else None,
        max_attempts=row["max_attempts"],
        lease_seconds=row["lease_seconds"],
        retired=row["retired"],
        retired_reason=row["retired_reason"],
        created_at=_time(row["created_at"]),
        created_by=row["created_by"],
        default_estimate=json.loads(row["default_estimate"]),
        simulator=row["simulator"],
    )


def attempt_of(row: dict[str, Any]) -> Attempt:
    receipt = None
    if row["receipt_digest"] is not None:
        receipt = Receipt(
            provider_reference=row["receipt_reference"],
            detail=json.loads(row["receipt_detail"]),
            digest=row["receipt_digest"],
            recorded_at=_time(row["receipt_recorded_at"]),
        )
    evidence = row["failure_evidence"]
    return Attempt(
        attempt_id=row["attempt_id"],
        effect_id=row["effect_id"],
        number=row["number"],
        stage=Stage(row["stage"]),
        provider_key=row["provider_key"],
        provider_key_reused=row["provider_key_reused"],
        lease_expires_at=required_time(row["lease_expires_at"]),
        authorized_at=required_time(row["authorized_at"]),
        decision_id=row["decision_id"],
        dispatched_at=_time(row["dispatched_at"]),
        finished_at=_time(row["finished_at"]),
        outcome_reason=row["outcome_reason"],
        failure_evidence=FailureEvidence(evidence) if evidence else None,
        receipt=receipt,
        approval_id=row["approval_id"] or "",
        principal_id=row["principal_id"],
    )


def effect_of(row: dict[str, Any] | None, attempt_rows: list[dict[str, Any]]) -> Effect | None:
    if row is None:
        return None
    return Effect(
        effect_id=row["effect_id"],
        run_id=row["run_id"],
        tool=row["tool"],
        tool_revision=row["tool_revision"],
        target=row["target"],
        idempotency_key=row["idempotency_key"],
        intent_digest=row["intent_digest"],
        arguments=json.loads(row["arguments"]),
        stage=Stage(row["stage"]),
        created_at=required_time(row["created_at"]),
        updated_at=required_time(row["updated_at"]),
        attempts=[attempt_of(a) for a in attempt_rows],
        reconciled_by=row["reconciled_by"],
        reconcile_reason=row["reconcile_reason"],
    )


def budget_of(row: dict[str, Any]) -> Budget:
    return Budget(
        budget_id=row["budget_id"],
        scope=Scope(row["scope"]),
        scope_id=row["scope_id"],
        dimension=row["dimension"],
        limit=row["limit_amount"],
        posted=row["posted"],
        pending=row["pending"],
        reset_period_seconds=row["reset_period_seconds"],
        period_started_at=required_time(row["period_started_at"]),
        period_ends_at=_time(row["period_ends_at"]),
        created_at=required_time(row["created_at"]),
        updated_at=required_time(row["updated_at"]),
    )


@dataclass(frozen=True)
class AuthorizeFacts:
    """Everything AuthorizeEffect decides from, read in one round trip (None: not found)."""

    principal: Principal | None
    now: datetime | None
    run: Run | None
    effect: Effect | None
    current: ToolContract | None
    pinned: ToolContract | None
    obligations: tuple[str, ...]
    budgets: list[Budget]
    run_open: list[dict[str, Any]]
    on_target: list[dict[str, Any]]
    has_approvals: bool
    dimensions: frozenset[str] | None
    # The key has an open scheduled intent (the general path judges and consumes it).
    has_schedule: bool = False


def facts_of(document: dict[str, Any]) -> AuthorizeFacts:
    principal = document.get("principal")
    run = document.get("run")
    if principal is None or run is None:
        return AuthorizeFacts(
            principal_of(principal) if principal else None, None, None, None, None, None, (), [], [], [], False, None
        )
    dimensions = document.get("dimensions")
    return AuthorizeFacts(
        principal=principal_of(principal),
        now=_time(document["now"]),
        run=run_of(run),
        effect=effect_of(document["effect"], document["attempts"]),
        current=contract_of(document["current"]),
        pinned=contract_of(document["pinned"]),
        obligations=tuple(document["obligations"]),
        budgets=[budget_of(b) for b in document["budgets"]],
        run_open=document["run_open"],
        on_target=document["on_target"],
        has_approvals=bool(document["approvals"]),
        dimensions=frozenset(dimensions) if dimensions is not None else None,
        has_schedule=bool(document.get("scheduled")),
    )


async def authorize_facts(
    connection: Any,
    token_hash: str,
    run_id: str,
    key: str,
    tool: str,
    target: str,
    open_limit: int,
    target_limit: int,
    dimensions: bool,
) -> AuthorizeFacts:
    """One round trip: BEGIN and the facts function, in one query string."""
    document = await _read(
        connection, FACTS_CALL, (token_hash, run_id, key, tool, target, open_limit, target_limit, dimensions)
    )
    return facts_of(document)


async def _read(connection: Any, query: str, parameters: tuple[Any, ...]) -> dict[str, Any]:
    cursor = psycopg.AsyncClientCursor(connection)
    await cursor.execute(query, parameters)
    cursor.nextset()  # past BEGIN's result
    row = await cursor.fetchone()
    round_trips.note()
    assert row is not None
    document: dict[str, Any] = row[0]
    return document


async def attempt_facts(connection: Any, token_hash: str, attempt_id: str) -> dict[str, Any]:
    """One round trip: BEGIN and the attempt facts function, in one query string (a document:
    see ``el_attempt_facts``; the report's rules read it)."""
    return await _read(connection, ATTEMPT_FACTS_CALL, (token_hash, attempt_id))


# --- the write plan -------------------------------------------------------------------------


def text_of(value: Any) -> str:
    return canonical_bytes(value).decode("utf-8")


def event_item(
    tenant_id: str, run_id: str, event_type: str, payload: dict[str, Any], principal_id: str, now: datetime
) -> dict[str, str]:
    """An event whose hash the database completes: the canonical body around its revision.

    The body is the one ``domain.trace.event_hash`` hashes; the database puts the revision it
    assigns under the run row's lock between ``body_head`` and ``body_tail``.
    """
    body = {
        "tenant_id": tenant_id,
        "run_id": run_id,
        "revision": _REVISION_SENTINEL,
        "type": event_type,
        "payload": payload,
        "principal_id": principal_id,
        "created_at": timestamp_text(now),
    }
    text = text_of(body)
    # Keys are sorted: the top-level "revision" comes after "payload" and "principal_id" and
    # before "run_id", so its last occurrence is the top-level one.
    head, tail = text.rsplit(f'"revision":{_REVISION_SENTINEL},', 1)
    return {
        "type": event_type,
        "payload": text_of(payload),
        "principal_id": principal_id,
        "body_head": head + '"revision":',
        "body_tail": "," + tail,
    }


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def effect_row(tenant_id: str, effect: Effect) -> dict[str, Any]:
    return {
        "tenant_id": tenant_id,
        "effect_id": effect.effect_id,
        "run_id": effect.run_id,
        "tool": effect.tool,
        "tool_revision": effect.tool_revision,
        "target": effect.target,
        "idempotency_key": effect.idempotency_key,
        "intent_digest": effect.intent_digest,
        "arguments": text_of(effect.arguments),
        "stage": effect.stage.value,
        "created_at": _iso(effect.created_at),
        "updated_at": _iso(effect.updated_at),
        "reconciled_by": effect.reconciled_by,
        "reconcile_reason": effect.reconcile_reason,
    }


def attempt_row(tenant_id: str, attempt: Attempt) -> dict[str, Any]:
    receipt = attempt.receipt
    return {
        "tenant_id": tenant_id,
        "attempt_id": attempt.attempt_id,
        "effect_id": attempt.effect_id,
        "number": attempt.number,
        "stage": attempt.stage.value,
        "provider_key": attempt.provider_key,
        "provider_key_reused": attempt.provider_key_reused,
        "lease_expires_at": _iso(attempt.lease_expires_at),
        "authorized_at": _iso(attempt.authorized_at),
        "dispatched_at": _iso(attempt.dispatched_at),
        "finished_at": _iso(attempt.finished_at),
        "decision_id": attempt.decision_id,
        "outcome_reason": attempt.outcome_reason,
        "failure_evidence": attempt.failure_evidence.value if attempt.failure_evidence else None,
        "receipt_reference": receipt.provider_reference if receipt else None,
        "receipt_detail": text_of(receipt.detail) if receipt else None,
        "receipt_digest": receipt.digest if receipt else None,
        "receipt_recorded_at": _iso(receipt.recorded_at) if receipt else None,
        "approval_id": attempt.approval_id or None,
        "principal_id": attempt.principal_id,
    }


def decision_row(tenant_id: str, decision: Decision) -> dict[str, Any]:
    """The decision without its input bytes (sent beside the plan as bytea)."""
    return {
        "tenant_id": tenant_id,
        "decision_id": decision.decision_id,
        "run_id": decision.run_id,
        "effect_id": decision.effect_id,
        "attempt_id": decision.attempt_id,
        "outcome": decision.outcome.value,
        "reasons": text_of([r.as_json() for r in decision.reasons]),
        "policy_revision": decision.policy_revision,
        "engine": decision.engine,
        "input_digest": decision.input_digest,
        "intent_digest": decision.intent_digest,
        "idempotency_key": decision.idempotency_key,
        "principal_id": decision.principal_id,
        "tool": decision.tool,
        "created_at": _iso(decision.created_at),
    }


async def apply(connection: Any, plan: dict[str, Any], input_bytes: bytes) -> dict[str, Any]:
    """One round trip: the write function and COMMIT, in one query string.

    A connection that breaks meanwhile leaves the outcome unknown (the COMMIT may have landed).
    """
    cursor = psycopg.AsyncClientCursor(connection)
    try:
        if faults.armed():
            # A crash test: the write, then the crash point, then the COMMIT on its own.
            await cursor.execute(APPLY_CALL, (json.dumps(plan), input_bytes))
            row = await cursor.fetchone()
            faults.crash_point("before_commit")
            await cursor.execute("COMMIT")
        else:
            await cursor.execute(APPLY_CALL + "; COMMIT", (json.dumps(plan), input_bytes))
            row = await cursor.fetchone()
    except psycopg.Error as error:
        if error.sqlstate == OVERFLOW_SQLSTATE:
            raise CounterOverflow(str(error)) from error
        if not isinstance(error, psycopg.OperationalError) or not connection.broken:
            raise
        raise CommitOutcomeUnknown(
            "the database connection failed during commit: the outcome is unknown; "
            "retry with the same idempotency key and the ledger will answer what happened"
        ) from error
    round_trips.note()
    assert row is not None, "el_apply returns one row"
    result: dict[str, Any] = row[0]
    return result
