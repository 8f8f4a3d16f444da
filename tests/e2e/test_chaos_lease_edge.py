"""Chaos at the lease's edge: servers SIGKILLed and restarted while runtimes dispatch at the last
moment and reconcilers act on what reads show; no effect may be sent twice.

Three ``effect-ledger serve`` processes share one fresh PostgreSQL database (leases swept every
0.2 s, a 2 s reconcile grace). A chaos thread SIGKILLs a random one every 0.5-2 s and restarts it
on the same port. Meanwhile, every call recorded in one Jepsen-style history (tests/history.py):

- runtimes (one principal, each thread with a channel per server, picking one per call) take
  keys from a small pool, so that keys repeat and race, of two tools with a 2 s lease: a
  COMPENSATABLE one (a fresh provider key per attempt after a definite failure) and a
  RETRY_SAME_KEY one (provider idempotency: attempts share the provider key). After an ALLOW
  they do one of: a full cycle (dispatch, send, report SUCCEEDED); a dispatch at the lease's
  last moment (20-60 ms, plus up to one recent call latency, before its end, on the client's
  clock), raced half the time by another runtime's retry of the same key, whose AuthorizeEffect
  holds the effect's lock around the lease's end; a heartbeat (RenewLease) at the lease's last
  moment before sending; a send followed by a "crash" (UNKNOWN reported, or nothing); a provider
  rejection (FAILED); a release; or nothing at all (an abandoned attempt);
- reconcilers (other principals) list open effects and read effects, and watch leases: they
  read an effect a few times around the moment a lease they saw ends. On an UNKNOWN attempt they
  ask the simulated provider: applied, they reconcile with its receipt; not applied, with
  not_happened, which the service refuses (``RECONCILE_TOO_EARLY``) until the grace after the
  lease has passed.

The simulated provider applies a request at most once per provider idempotency key (the key the
gate handed out), as a real provider honoring idempotency keys does. A runtime sends only after
RecordDispatch (or RenewLease) answered DISPATCHED, and only while its lease, counted on its own
clock from the moment it asked (a lower bound of the service's lease end), has more than 0.5 s
left; the check and the application are one step under the provider's lock.

After the chaos: no more kills, every lease and grace runs out, what is left UNKNOWN is
reconciled from the provider's record, and the final read (GetEffect for every effect of the
tenant) must show: no violation in the history (``check_all`` with the tools' leases, so that
``check_unknown_never_revived`` also judges a dispatch concurrent with a read that showed its
attempt UNKNOWN), every idempotency key applied by the provider under at most one provider key,
the ledger agreeing with the provider (applied means SUCCEEDED with its receipt, not applied
means not SUCCEEDED), nothing left open, and ``effect-ledger verify`` passing.

Against the code before leases were judged by the clock read after the effect's lock, this
finds the double send it was written for: a dispatch waiting for the lock across the lease's
end is answered DISPATCHED while a read shows the attempt UNKNOWN, a reconciler settles it
not_happened, and the next attempt sends it again.

The random choices come from one seed: ``EFFECT_LEDGER_CHAOS_SEED`` when set, else a random one,
printed at the start and named in every assertion. A seed replays the choices, not the thread
interleaving or the kill timing relative to the calls.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from history import (
    FinalEffect,
    History,
    RecordingClient,
    Result,
    check_all,
    check_unknown_never_revived,
    final_effect,
    summarize,
)

from effect_ledger.domain.canonical import intent_digest
from effectledger.v1 import common_pb2, gate_pb2
from support import (
    ServerProcess,
    contract,
    failed,
    new_run,
    psycopg_url,
    servers_on_fresh_database,
    succeeded,
    unknown,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.postgres]

SEED_ENV = "EFFECT_LEDGER_CHAOS_SEED"

SERVERS = 3
LEASE_SECONDS = 2
GRACE_SECONDS = 2.0
SWEEP_SECONDS = 0.2
CHAOS_SECONDS = 35.0
KILL_PAUSE_SECONDS = (0.5, 2.0)

RUNTIMES = 10
RECONCILERS = 3
RECONCILER_PRINCIPALS = ("admin", "operator", "admin")
RUNS = 2
# Keys in use at a time, per tool: few, so that they repeat and race. Most go to the
# COMPENSATABLE tool: its key is blocked while an attempt is open, so an attempt's lease runs to
# its end untouched by siblings (under RETRY_SAME_KEY a sibling's success often settles an
# attempt before its last moment comes), and its next attempt gets a fresh provider key.
SLOTS_NOTIFY, SLOTS_CHARGE = 5, 2
NOTIFY_SHARE = 0.75  # of the runtimes' picks
MAX_ATTEMPTS = 100

EDGE_BEFORE_SECONDS = (0.02, 0.06)  # how long before the lease's end the last-moment call goes
# ... plus up to one recent call latency of the runtime: under load a call sent 20-60 ms before
# the end reaches the service after it, and the race is lost before it starts.
LATENCY_WEIGHT = 0.2  # of each new sample in the runtime's moving average
# Of the last-moment dispatches of the COMPENSATABLE tool, the share that another runtime's retry
# of the same key races: its AuthorizeEffect (RECONCILE_REQUIRED) holds the effect's lock for a
# moment around the lease's end, so the dispatch may wait for the lock across it.
CONTENDER_SHARE = 0.5
WATCH_SHARE = 0.5  # of list rounds followed by a watch of a lease about to end
WATCH_AFTER_SECONDS = (-0.005, 0.1)  # when, around a lease's end, a watching reconciler reads
WATCH_READS = 3
SEND_MARGIN_SECONDS = 0.5  # a runtime sends only with more lease than this left, on its clock
CALL_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 3.0
# A not_happened must be judged well within the lease plus the grace of the read it relies on
# (an attempt created after the read cannot be settled by it before then): the evidence is used
# only this fresh, and the call is given only this long.
EVIDENCE_FRESH_SECONDS = 1.5
RECONCILE_TIMEOUT_SECONDS = 1.5
SETTLE_MARGIN_SECONDS = 1.0
FINAL_RECONCILE_SECONDS = 20.0
JOIN_SECONDS = 15.0

NOTIFY = "notify.push"  # COMPENSATABLE
CHARGE = "payment.capture"  # RETRY_SAME_KEY, provider idempotency
RECEIPT_DETAIL = b'{"status":"applied"}'
OPEN_STAGES = ("AUTHORIZED", "DISPATCHED", "UNKNOWN")

# What a runtime does with an ALLOW, and how often.
BEHAVIOURS = {
    "cycle": 4,  # dispatch, send, report SUCCEEDED
    "edge": 5,  # dispatch at the lease's last moment, then as a cycle
    "renew_edge": 2,  # dispatch, heartbeat at the lease's last moment, then send
    "vanish": 2,  # dispatch, send, then report UNKNOWN or nothing
    "reject": 1,  # dispatch, the provider says no, report FAILED
    "release": 1,  # give it back before dispatch
    "abandon": 2,  # walk away
}


def chaos_seed() -> int:
    value = os.environ.get(SEED_ENV, "").strip()
    return int(value) if value else random.SystemRandom().randrange(2**32)


def server_knows_reconcile_grace() -> bool:
    """Whether ``serve`` has ``--reconcile-grace-seconds`` (servers before it do not)."""
    shown = subprocess.run(
        [sys.executable, "-m", "effect_ledger", "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    return "--reconcile-grace-seconds" in shown.stdout


# --- the simulated provider ----------------------------------------------------------------------


class Provider:
    """Applies a request at most once per provider idempotency key, and remembers the truth."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.applied: dict[str, str] = {}  # provider key -> reference
        self.applied_keys: dict[str, set[str]] = defaultdict(set)  # idempotency key -> provider keys
        self.too_late = 0

    def send(self, key: str, provider_key: str, send_by: float) -> str | None:
        """Apply (or find applied) unless the sender's own clock says its lease is too short now."""
        with self.lock:
            if time.monotonic() >= send_by:
                self.too_late += 1
                return None
            self.applied_keys[key].add(provider_key)
            return self.applied.setdefault(provider_key, f"ref-{provider_key}")

    def reject(self, provider_key: str) -> str | None:
        """Say no, unless a request under this key was applied already (then answer with it)."""
        with self.lock:
            return self.applied.get(provider_key)

    def lookup(self, provider_key: str) -> str | None:
        with self.lock:
            return self.applied.get(provider_key)


# --- keys --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Intent:
    key: str
    tool: str
    run_id: str
    target: str
    arguments: bytes
    digest: str

    def request(self) -> gate_pb2.AuthorizeEffectRequest:
        return gate_pb2.AuthorizeEffectRequest(
            run_id=self.run_id,
            tool=self.tool,
            target=self.target,
            arguments_json=self.arguments,
            idempotency_key=self.key,
        )

    @property
    def tag(self) -> dict[str, str]:
        return {"key": self.key, "tool": self.tool}


class KeyPool:
    """A few slots per tool, each holding one key at a time: a key is replaced once it is done
    (DUPLICATE, or out of attempts), so that the pool always has keys to race on."""

    def __init__(self, tag: str, run_ids: list[str], revisions: dict[str, int]) -> None:
        self.tag = tag
        self.lock = threading.Lock()
        self.revisions = revisions
        counts = {NOTIFY: SLOTS_NOTIFY, CHARGE: SLOTS_CHARGE}
        self.slots = [(tool, run_ids[n % len(run_ids)]) for tool in (NOTIFY, CHARGE) for n in range(counts[tool])]
        self.generation = [0] * len(self.slots)
        self.effect_ids: set[str] = set()

    def intent(self, slot: int) -> Intent:
        tool, run_id = self.slots[slot]
        generation = self.generation[slot]
        key = f"{self.tag}-s{slot}-g{generation}"
        if tool == NOTIFY:
            target, arguments = f"device:{key}", {"title": f"slot {slot}", "generation": generation}
        else:
            target, arguments = f"order:{key}", {"amount": 100 + slot, "currency": "EUR", "generation": generation}
        digest = intent_digest(tool=tool, tool_revision=self.revisions[tool], target=target, arguments=arguments)
        raw = json.dumps(arguments, separators=(",", ":")).encode()
        return Intent(key, tool, run_id, target, raw, digest)

    def pick(self, rng: random.Random) -> tuple[int, Intent]:
        tool = NOTIFY if rng.random() < NOTIFY_SHARE else CHARGE
        with self.lock:
            slot = rng.choice([n for n, (t, _) in enumerate(self.slots) if t == tool])
            return slot, self.intent(slot)

    def retire(self, slot: int, key: str) -> None:
        with self.lock:
            if self.intent(slot).key == key:
                self.generation[slot] += 1

    def seen(self, effect_id: str) -> None:
        if effect_id:
            with self.lock:
                self.effect_ids.add(effect_id)

    def known_effects(self) -> list[str]:
        with self.lock:
            return sorted(self.effect_ids)


# --- the clients ---------------------------------------------------------------------------------


def stage_of(result: Result) -> str:
    response = result.response
    if isinstance(response, gate_pb2.AttemptResponse):
        return common_pb2.Stage.Name(response.attempt.stage)
    return common_pb2.Stage.Name(response.stage)


def monotonic_at(moment) -> float:
    """A service timestamp (its database clock, UTC) on this process's monotonic clock."""
    wall = moment.ToDatetime(tzinfo=UTC)
    return time.monotonic() + (wall - datetime.now(UTC)).total_seconds()


class Actor:
    def __init__(self, name: str, clients: list[RecordingClient], rng: random.Random, stop: threading.Event) -> None:
        self.name = name
        self.clients = clients
        self.rng = rng
        self.stop = stop
        self.counts: Counter[str] = Counter()
        self.error: BaseException | None = None

    def client(self) -> RecordingClient:
        return self.rng.choice(self.clients)

    def pause(self, low: float, high: float) -> None:
        self.stop.wait(self.rng.uniform(low, high))

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
        except BaseException as error:  # reported by the test, with the seed
            self.error = error

    def step(self) -> None:
        raise NotImplementedError


class Runtime(Actor):
    """An agent runtime: authorize, then one behaviour; it never reconciles."""

    def __init__(
        self, name, clients, rng, stop, pool: KeyPool, provider: Provider, contenders: list[RecordingClient]
    ) -> None:
        super().__init__(name, clients, rng, stop)
        self.pool = pool
        self.provider = provider
        self.contenders = contenders  # the same principal, recorded as another process
        self.contending: list[threading.Thread] = []
        self.counts_lock = threading.Lock()
        self.behaviours = list(BEHAVIOURS)
        self.weights = [BEHAVIOURS[b] for b in self.behaviours]
        self.latency = 0.0  # a moving average of this runtime's answered calls, in seconds

    def run(self) -> None:
        super().run()
        for thread in self.contending:
            thread.join(timeout=JOIN_SECONDS)

    def timed(self, call) -> Result:
        began = time.monotonic()
        result = call()
        if result.type == "ok":
            self.latency += LATENCY_WEIGHT * (time.monotonic() - began - self.latency)
        return result

    def before_the_end(self) -> float:
        """How long before a lease's end the last-moment call is sent."""
        return self.rng.uniform(*EDGE_BEFORE_SECONDS) + self.rng.random() * self.latency

    def step(self) -> None:
        slot, intent = self.pool.pick(self.rng)
        client = self.client()
        answer = self.timed(
            lambda: client.authorize(intent.request(), digest=intent.digest, timeout=CALL_TIMEOUT_SECONDS)
        )
        if answer.type != "ok":
            self.counts[f"authorize {answer.type} {answer.reason or answer.error.code}"] += 1
            self.pause(0.02, 0.1)
            return
        response = answer.response
        self.pool.seen(response.effect_id)
        outcome = common_pb2.Outcome.Name(response.outcome)
        reasons = [reason.code for reason in response.reasons]
        self.counts[f"authorize {outcome}"] += 1
        if outcome == "ALLOW":
            behaviour = self.rng.choices(self.behaviours, self.weights)[0]
            self.counts[f"{intent.tool} {behaviour}"] += 1
            self.attempt(behaviour, intent, response)
        elif outcome == "DUPLICATE" or "RETRY_LIMIT_EXCEEDED" in reasons:
            self.pool.retire(slot, intent.key)
        else:
            self.pause(0.05, 0.2)  # RECONCILE_REQUIRED: the reconcilers see to it

    def attempt(self, behaviour: str, intent: Intent, allowed: gate_pb2.AuthorizeEffectResponse) -> None:
        attempt_id, provider_key = allowed.attempt_id, allowed.provider_idempotency_key
        tag = {**intent.tag, "effect_id": allowed.effect_id}
        label = f"{intent.tool} {behaviour}"
        if behaviour == "abandon":
            return
        if behaviour == "release":
            self.client().release(attempt_id, "another route", timeout=CALL_TIMEOUT_SECONDS, **tag)
            return
        if behaviour == "edge":
            lease_end = monotonic_at(allowed.lease_expires_at)
            if intent.tool == NOTIFY and self.rng.random() < CONTENDER_SHARE:
                before = self.rng.uniform(*EDGE_BEFORE_SECONDS)
                contender = threading.Thread(target=self.contend, args=(intent, lease_end - before), daemon=True)
                contender.start()
                self.contending = [t for t in self.contending if t.is_alive()] + [contender]
            self.stop.wait(max(0.0, lease_end - self.before_the_end() - time.monotonic()))
        asked = time.monotonic()
        client = self.client()
        dispatched = self.timed(lambda: client.dispatch(attempt_id, timeout=CALL_TIMEOUT_SECONDS, **tag))
        self.counts[f"{label}: dispatch {self.answer(dispatched)}"] += 1
        if dispatched.type != "ok" or stage_of(dispatched) != "DISPATCHED" or not dispatched.response.changed:
            return  # refused, lost or not DISPATCHED by this call: never send
        if behaviour == "renew_edge":
            before = self.before_the_end()
            lease_end = monotonic_at(dispatched.response.attempt.lease_expires_at)
            self.stop.wait(max(0.0, lease_end - before - time.monotonic()))
            asked = time.monotonic()
            renewed = self.client().renew_lease(attempt_id, timeout=CALL_TIMEOUT_SECONDS, **tag)
            self.counts[f"{label}: renew {self.answer(renewed)}"] += 1
            if renewed.type != "ok" or stage_of(renewed) != "DISPATCHED":
                return  # never send on a lease that may have run out
        send_by = asked + LEASE_SECONDS - SEND_MARGIN_SECONDS
        if behaviour == "reject":
            reference = self.provider.reject(provider_key)
            if reference is None:
                request = failed(attempt_id, gate_pb2.PROVIDER_REJECTED, "the provider answered 422")
                self.client().outcome(request, timeout=CALL_TIMEOUT_SECONDS, **tag)
                return
        else:
            reference = self.provider.send(intent.key, provider_key, send_by)
            if reference is None:
                self.counts[f"{label}: lease too short to send"] += 1
                return  # not sent: it runs out, and a reconciler settles it
        self.counts[f"{label}: sent"] += 1
        if behaviour == "vanish":
            if self.rng.random() < 0.5:
                self.client().outcome(
                    unknown(attempt_id, "the runtime lost the provider's answer"), timeout=CALL_TIMEOUT_SECONDS, **tag
                )
            return
        reported = self.client().outcome(
            succeeded(attempt_id, reference, RECEIPT_DETAIL), timeout=CALL_TIMEOUT_SECONDS, **tag
        )
        self.counts[f"{label}: report {self.answer(reported)}"] += 1
        if reported.type == "info" and self.rng.random() < 0.5:
            # The report may be lost: say what is certain, that it may have happened.
            self.client().outcome(
                unknown(attempt_id, "the report's answer was lost"), timeout=CALL_TIMEOUT_SECONDS, **tag
            )

    def contend(self, intent: Intent, at: float) -> None:
        """Another runtime's retry of the same key at the lease's last moment."""
        self.stop.wait(max(0.0, at - time.monotonic()))
        client = self.rng.choice(self.contenders)
        answer = client.authorize(intent.request(), digest=intent.digest, timeout=CALL_TIMEOUT_SECONDS)
        outcome = common_pb2.Outcome.Name(answer.response.outcome) if answer.type == "ok" else answer.type
        with self.counts_lock:  # an ALLOW (the key was settled meanwhile) is abandoned
            self.counts[f"contender: {outcome}"] += 1

    @staticmethod
    def answer(result: Result) -> str:
        if result.type == "ok":
            return stage_of(result)
        return f"{result.type} {result.reason or result.error.code}"


class Reconciler(Actor):
    """Works from reads: an attempt shown UNKNOWN is settled with what the provider says."""

    def __init__(self, name, clients, rng, stop, pool: KeyPool, provider: Provider, run_ids: list[str]) -> None:
        super().__init__(name, clients, rng, stop)
        self.pool = pool
        self.provider = provider
        self.run_ids = run_ids
        self.refusals: list[str] = []

    def step(self) -> None:
        self.sweep(self.client())
        self.pause(0.05, 0.25)

    def sweep(self, client: RecordingClient) -> int:
        """One round of reads and reconciliations; returns how many open effects it saw."""
        seen = 0
        if self.rng.random() < 0.7:
            ending: list[tuple[float, str]] = []
            for run_id in self.run_ids:
                read_at = time.monotonic()
                for effect in self.list_open(client, run_id):
                    seen += 1
                    self.settle(client, effect, read_at)
                    ending += [
                        (monotonic_at(a.lease_expires_at), effect.effect_id)
                        for a in effect.attempts
                        if common_pb2.Stage.Name(a.stage) in ("AUTHORIZED", "DISPATCHED")
                    ]
            ending = [(end, effect_id) for end, effect_id in ending if 0 < end - time.monotonic() <= LEASE_SECONDS]
            if ending and self.rng.random() < WATCH_SHARE:
                self.watch(self.client(), *self.rng.choice(ending))
        else:
            known = self.pool.known_effects()
            if known:
                read_at = time.monotonic()
                read = client.get_effect(self.rng.choice(known), timeout=READ_TIMEOUT_SECONDS)
                if read.type == "ok":
                    seen += common_pb2.Stage.Name(read.response.stage) in OPEN_STAGES
                    self.settle(client, read.response, read_at)
        return seen

    def watch(self, client: RecordingClient, lease_end: float, effect_id: str) -> None:
        """Read the effect around the moment a lease it holds ends (as a reconciler waiting for
        it), and act on what the reads show."""
        for offset in sorted(self.rng.uniform(*WATCH_AFTER_SECONDS) for _ in range(WATCH_READS)):
            self.stop.wait(max(0.0, lease_end + offset - time.monotonic()))
            read_at = time.monotonic()
            read = client.get_effect(effect_id, timeout=READ_TIMEOUT_SECONDS)
            self.counts[f"watch: {read.type}"] += 1
            if read.type == "ok":
                self.settle(client, read.response, read_at)

    def list_open(self, client: RecordingClient, run_id: str) -> list[gate_pb2.Effect]:
        effects, token = [], ""
        while True:
            listed = client.list_open_effects(run_id, token, timeout=READ_TIMEOUT_SECONDS)
            if listed.type != "ok":
                return effects
            effects += list(listed.response.effects)
            for effect in listed.response.effects:
                self.pool.seen(effect.effect_id)
            token = listed.response.next_page_token
            if not token:
                return effects

    def settle(self, client: RecordingClient, effect: gate_pb2.Effect, read_at: float) -> None:
        open_attempts = [a for a in effect.attempts if common_pb2.Stage.Name(a.stage) in OPEN_STAGES]
        if not any(common_pb2.Stage.Name(a.stage) == "UNKNOWN" for a in open_attempts):
            return
        tag = {"key": effect.idempotency_key, "tool": effect.tool}
        references = [self.provider.lookup(a.provider_idempotency_key) for a in open_attempts]
        reference = next((r for r in references if r), None)
        if reference is not None:
            request = gate_pb2.ReconcileEffectRequest(
                effect_id=effect.effect_id,
                receipt=common_pb2.Receipt(provider_reference=reference, detail_json=RECEIPT_DETAIL),
            )
            kind = "receipt"
        else:
            if any(common_pb2.Stage.Name(a.stage) != "UNKNOWN" for a in open_attempts):
                return  # an attempt is live: its runtime may be sending right now
            if time.monotonic() - read_at > EVIDENCE_FRESH_SECONDS:
                return  # stale: read again first
            request = gate_pb2.ReconcileEffectRequest(
                effect_id=effect.effect_id,
                not_happened=gate_pb2.ReconcileEffectRequest.NotHappened(reason="the provider has no such request"),
            )
            kind = "not_happened"
        result = client.reconcile(request, timeout=RECONCILE_TIMEOUT_SECONDS, **tag)
        outcome = "ok" if result.type == "ok" else f"{result.type} {result.reason or result.error.code}"
        self.counts[f"reconcile {kind}: {outcome}"] += 1
        if result.type == "fail" and result.reason == "RECONCILE_TOO_EARLY" and kind == "receipt":
            self.refusals.append(f"{effect.effect_id}: a receipt was refused RECONCILE_TOO_EARLY")


class Chaos:
    """SIGKILLs a random server every 0.5-2 s and restarts it on the same port."""

    def __init__(self, servers: list[ServerProcess], rng: random.Random, stop: threading.Event) -> None:
        self.servers = servers
        self.rng = rng
        self.stop = stop
        self.kills = 0
        self.restart_seconds: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(self.rng.uniform(*KILL_PAUSE_SECONDS)):
                server = self.rng.choice(self.servers)
                began = time.monotonic()
                server.kill()
                self.kills += 1
                server.start()
                self.restart_seconds.append(time.monotonic() - began)
        except BaseException as error:
            self.error = error


# --- the test ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    seed: int
    history: History
    provider: Provider
    final: dict[str, FinalEffect]
    contracts: dict[str, list[str]]
    left_open: dict[str, str]
    counts: Counter
    kills: int
    restart_seconds: list[float]
    errors: list[str]
    refusals: list[str]
    database_url: str
    verify: subprocess.CompletedProcess
    server_logs: str
    phases: dict[str, float] = field(default_factory=dict)


def tool_contracts():
    notify = contract(
        NOTIFY,
        effect_class=common_pb2.COMPENSATABLE,
        provider_idempotency=False,
        allowed_recovery=(common_pb2.COMPENSATE,),
        max_attempts=MAX_ATTEMPTS,
        lease_seconds=LEASE_SECONDS,
    )
    charge = contract(
        CHARGE,
        effect_class=common_pb2.RETRYABLE_WITH_KEY,
        provider_idempotency=True,
        allowed_recovery=(common_pb2.RETRY_SAME_KEY,),
        max_attempts=MAX_ATTEMPTS,
        lease_seconds=LEASE_SECONDS,
    )
    return notify, charge


def run_chaos(seed: int) -> Outcome:
    started = time.monotonic()
    phases: dict[str, float] = {}
    rng = random.Random(seed)
    args = ["--lease-sweep-interval-seconds", str(SWEEP_SECONDS)]
    if server_knows_reconcile_grace():
        args += ["--reconcile-grace-seconds", str(GRACE_SECONDS)]
    history = History()
    provider = Provider()
    clients: list[RecordingClient] = []
    with servers_on_fresh_database("el_chaos", SERVERS, args) as (url, servers, tenant):
        phases["start"] = time.monotonic() - started
        tenant.add("operator", "operator")
        with tenant.client(servers[0], "admin") as admin:
            written = [admin.tools.PutToolContract(request) for request in tool_contracts()]
        with tenant.client(servers[0], "agent") as agent:
            run_ids = [new_run(agent) for _ in range(RUNS)]
        revisions = {c.tool: c.revision for c in written}
        contracts = {c.tool: [common_pb2.Recovery.Name(r) for r in c.allowed_recovery] for c in written}
        pool = KeyPool(uuid.uuid4().hex[:8], run_ids, revisions)

        def channels(process: str, principal: str) -> list[RecordingClient]:
            made = [
                RecordingClient(
                    history,
                    process,
                    tenant.name,
                    server.target,
                    tenant.tokens[principal],
                    timeout_seconds=CALL_TIMEOUT_SECONDS,
                )
                for server in servers
            ]
            clients.extend(made)
            return made

        stop_work, stop_chaos = threading.Event(), threading.Event()
        runtimes = [
            Runtime(
                f"rt{n}",
                channels(f"rt{n}", "agent"),
                random.Random(rng.random()),
                stop_work,
                pool,
                provider,
                channels(f"rt{n}-retry", "agent"),
            )
            for n in range(RUNTIMES)
        ]
        reconcilers = [
            Reconciler(
                f"rc{n}", channels(f"rc{n}", principal), random.Random(rng.random()), stop_work, pool, provider, run_ids
            )
            for n, principal in zip(range(RECONCILERS), RECONCILER_PRINCIPALS, strict=False)
        ]
        chaos = Chaos(servers, random.Random(rng.random()), stop_chaos)
        actors: list[Actor] = [*runtimes, *reconcilers]
        threads = [threading.Thread(target=actor.run, name=actor.name, daemon=True) for actor in actors]
        chaos_thread = threading.Thread(target=chaos.run, name="chaos", daemon=True)
        try:
            for thread in [*threads, chaos_thread]:
                thread.start()
            stop_chaos.wait(CHAOS_SECONDS)
            stop_chaos.set()
            stop_work.set()
            for thread in threads:
                thread.join(timeout=JOIN_SECONDS)
            chaos_thread.join(timeout=60)
            phases["chaos"] = time.monotonic() - started
            errors = [f"{a.name}: {a.error!r}" for a in [*actors, chaos] if a.error is not None]
            errors += [f"{t.name} did not stop" for t in [*threads, chaos_thread] if t.is_alive()]
            for server in servers:
                if server.process is None or server.process.poll() is not None:
                    server.start()

            # Every lease (2 s) and the grace after it (2 s) run out; then what is left UNKNOWN is
            # settled from the provider's record.
            time.sleep(LEASE_SECONDS + GRACE_SECONDS + SETTLE_MARGIN_SECONDS)
            cleaner = Reconciler(
                "final",
                channels("final", "admin"),
                random.Random(rng.random()),
                threading.Event(),
                pool,
                provider,
                run_ids,
            )
            left_open: dict[str, str] = {}
            until = time.monotonic() + FINAL_RECONCILE_SECONDS
            while time.monotonic() < until:
                client = cleaner.clients[0]
                left_open = {}
                for run_id in run_ids:
                    read_at = time.monotonic()
                    for effect in cleaner.list_open(client, run_id):
                        left_open[effect.effect_id] = common_pb2.Stage.Name(effect.stage)
                        cleaner.settle(client, effect, read_at)
                if not left_open:
                    break
                time.sleep(0.3)
            phases["settle"] = time.monotonic() - started

            # The final read: every effect of the tenant, by its id.
            with psycopg.connect(psycopg_url(url)) as connection:
                effect_ids = [
                    row[0]
                    for row in connection.execute(
                        "SELECT effect_id FROM effects WHERE tenant_id = %s ORDER BY effect_id", (tenant.name,)
                    )
                ]
            checker = channels("checker", "auditor")[0]
            final = {}
            for effect_id in effect_ids:
                read = checker.get_effect(effect_id, wait_for_ready=True, timeout=CALL_TIMEOUT_SECONDS)
                assert read.type == "ok", f"seed {seed}: final GetEffect {effect_id}: {read.error}"
                final[effect_id] = final_effect(tenant.name, read.response)
            verify = subprocess.run(
                [sys.executable, "-m", "effect_ledger", "verify", "--database-url", url],
                capture_output=True,
                text=True,
                timeout=60,
            )
            phases["verify"] = time.monotonic() - started
            counts: Counter = Counter()
            for actor in [*actors, cleaner]:
                counts.update(actor.counts)
            return Outcome(
                seed=seed,
                history=history,
                provider=provider,
                final=final,
                contracts=contracts,
                left_open=left_open,
                counts=counts,
                kills=chaos.kills,
                restart_seconds=chaos.restart_seconds,
                errors=errors,
                refusals=[r for rc in [*reconcilers, cleaner] for r in rc.refusals],
                database_url=url,
                verify=verify,
                server_logs="\n".join(f"--- server {n}\n{s.log()[-1200:]}" for n, s in enumerate(servers)),
                phases=phases,
            )
        finally:
            stop_chaos.set()
            stop_work.set()
            for client in clients:
                client.close()


def test_chaos_at_the_lease_edge_never_sends_an_effect_twice():
    seed = chaos_seed()
    print(f"\n{SEED_ENV}={seed}", flush=True)
    outcome = run_chaos(seed)
    history, final, provider = outcome.history, outcome.final, outcome.provider

    def explain(message: str) -> str:
        folder = Path(tempfile.mkdtemp(prefix="el-chaos-history-"))
        (folder / "history.jsonl").write_text(history.to_json_lines())
        return (
            f"seed {seed} (replay with {SEED_ENV}={seed}): {message}\nhistory: {folder / 'history.jsonl'}\n"
            f"last ops:\n{history.format(last=30)}\nserver logs:\n{outcome.server_logs}"
        )

    problems = [f"errors: {error}" for error in outcome.errors]

    # The history checks, the revival of an UNKNOWN attempt among them.
    leases = {tool: float(LEASE_SECONDS) for tool in (NOTIFY, CHARGE)}
    violations = check_all(history, contracts=outcome.contracts, final=final, leases=leases)
    violations += [v for v in check_unknown_never_revived(history, final, leases) if v not in violations]
    if violations:
        problems.append(summarize(violations))

    # The provider applied each effect under at most one provider key, and the ledger agrees.
    twice = {key: sorted(keys) for key, keys in provider.applied_keys.items() if len(keys) > 1}
    if twice:
        problems.append(f"applied under more than one provider key (sent twice): {twice}")
    for effect in final.values():
        applied = sorted(provider.applied_keys.get(effect.key, set()))
        if applied and (effect.stage != "SUCCEEDED" or effect.receipt != provider.applied[applied[0]]):
            problems.append(
                f"{effect.key}: the provider applied {applied}, the ledger shows "
                f"{effect.stage} {effect.receipt!r}: {effect.attempts}"
            )
        if not applied and effect.stage == "SUCCEEDED":
            problems.append(f"{effect.key}: SUCCEEDED ({effect.receipt!r}), the provider applied nothing")
    problems += outcome.refusals

    # Nothing is left open, and every run's trace verifies.
    if outcome.left_open:
        problems.append(f"still open after the final reconciliation: {outcome.left_open}")
    if outcome.verify.returncode != 0:
        problems.append(f"effect-ledger verify: {outcome.verify.stdout}{outcome.verify.stderr}")

    # The run did what it is for: servers died, leases were met at their edge, effects were
    # applied and reconciled.
    counts = outcome.counts
    activity = {
        "kills": outcome.kills,
        "applied": len(provider.applied),
        "edge dispatches": sum(n for name, n in counts.items() if " edge: dispatch" in name),
        "reconciled": sum(n for name, n in counts.items() if name.startswith("reconcile") and name.endswith(": ok")),
    }
    if not all(activity.values()):
        problems.append(f"the run did too little: {activity}")

    ops = Counter(op.type for op in history.ops)
    print(
        f"seed {seed}: {len(history.ops)} ops (ok {ops['ok']}, fail {ops['fail']}, info {ops['info']}); "
        f"{len(final)} effects, {sum(len(e.attempts) for e in final.values())} attempts; {activity}; "
        f"restarts {[round(s, 1) for s in outcome.restart_seconds]}; phases "
        f"{ {k: round(v, 1) for k, v in outcome.phases.items()} }"
    )
    for name, n in sorted(counts.items()):
        print(f"  {name}: {n}")
    assert not problems, explain("\n\n".join(problems))
