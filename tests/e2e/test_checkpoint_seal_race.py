"""A seal never holds a revision whose effects it does not hold, across server processes.

Three ``effect-ledger serve`` processes share one fresh PostgreSQL database. Each round reads the
run's revision R, then sends SealCheckpoint(expected_revision=R) to one process and an
AuthorizeEffect with a new key to another, at the same moment (with a little jitter either way,
so each side wins some rounds). Whatever the interleaving, the answer must be one of two:

- the seal is refused with REVISION_MOVED, naming the run's current revision (R + 1: the
  authorization's event), and writes nothing; or
- the checkpoint is at revision R and its open effects are exactly the effects whose
  ``effect.authorized`` event has a revision <= R; the racing authorization's event comes after
  the ``checkpoint.sealed`` event (R + 2).

A checkpoint at a revision that misses an effect authorized at or before it would let a resume
forget an effect that may have happened.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass

import grpc
import pytest

from effect_ledger.client import error_from_rpc
from effectledger.v1 import (
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    common_pb2,
    gate_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
)
from support import (
    ServerProcess,
    authorize_request,
    contract,
    servers_on_fresh_database,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.postgres]

SERVERS = 3
CALL_TIMEOUT_SECONDS = 20.0
# No lease may run out mid-test: every effect stays AUTHORIZED, so every one stays open.
LEASE_SECONDS = 3600
ROUNDS_MIN = 100
ROUNDS_MAX = 250
RACE_SECONDS_MAX = 25.0
# Each side waits a random moment before sending, so sometimes one side leads, sometimes the other
# (the seal may wait longer: an authorization does more work before it reaches the run row).
SEAL_JITTER_SECONDS = 0.010
AUTHORIZE_JITTER_SECONDS = 0.003
WINS_WANTED = 5
MAIL = "email.send"


@dataclass
class Cluster:
    url: str
    servers: list[ServerProcess]
    token: str


@pytest.fixture(scope="module")
def cluster():
    with servers_on_fresh_database("el_seal_race", SERVERS) as (url, servers, tenant):
        admin = tenant.client(servers[0], "admin")
        admin.tools.PutToolContract(contract(MAIL, lease_seconds=LEASE_SECONDS))
        admin.close()
        yield Cluster(url, servers, tenant.tokens["agent"])


@dataclass
class Round:
    expected_revision: int
    effect_id: str
    checkpoint: checkpoints_pb2.Checkpoint | None
    current_revision: int | None  # from a REVISION_MOVED refusal


class Stubs:
    def __init__(self, cluster: Cluster) -> None:
        self.channels = [grpc.aio.insecure_channel(server.target) for server in cluster.servers]
        self.gates = [gate_pb2_grpc.GateStub(c) for c in self.channels]
        self.runs = [runs_pb2_grpc.RunsStub(c) for c in self.channels]
        self.checkpoints = [checkpoints_pb2_grpc.CheckpointsStub(c) for c in self.channels]
        self.options = {"metadata": (("authorization", f"Bearer {cluster.token}"),), "timeout": CALL_TIMEOUT_SECONDS}

    async def __aenter__(self) -> Stubs:
        await asyncio.gather(*(channel.channel_ready() for channel in self.channels))
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await asyncio.gather(*(channel.close() for channel in self.channels))

    async def events(self, run_id: str) -> list[runs_pb2.RunEvent]:
        found, after = [], 0
        while True:
            page = await self.runs[0].ListRunEvents(
                runs_pb2.ListRunEventsRequest(run_id=run_id, after_revision=after, page_size=1000), **self.options
            )
            found.extend(page.events)
            if not page.next_after_revision:
                return found
            after = page.next_after_revision


async def race_round(stubs: Stubs, run_id: str, index: int, rng: random.Random) -> Round:
    sealer, authorizer = index % SERVERS, (index + 1) % SERVERS
    revision = (
        await stubs.runs[index % SERVERS].GetRun(runs_pb2.GetRunRequest(run_id=run_id), **stubs.options)
    ).revision
    go = asyncio.Event()
    seal_delay, authorize_delay = rng.uniform(0, SEAL_JITTER_SECONDS), rng.uniform(0, AUTHORIZE_JITTER_SECONDS)

    async def seal():
        await go.wait()
        await asyncio.sleep(seal_delay)
        try:
            return await stubs.checkpoints[sealer].SealCheckpoint(
                checkpoints_pb2.SealCheckpointRequest(
                    run_id=run_id, expected_revision=revision, state_json=json.dumps({"round": index}).encode()
                ),
                **stubs.options,
            )
        except grpc.aio.AioRpcError as error:
            return error_from_rpc(error)

    async def authorize():
        await go.wait()
        await asyncio.sleep(authorize_delay)
        request = authorize_request(
            run_id, f"race-{index}-{uuid.uuid4().hex[:8]}", target=f"mailto:r{index}@example.com"
        )
        return await stubs.gates[authorizer].AuthorizeEffect(request, **stubs.options)

    sealing, authorizing = asyncio.ensure_future(seal()), asyncio.ensure_future(authorize())
    await asyncio.sleep(0)
    go.set()
    sealed, allowed = await asyncio.gather(sealing, authorizing)
    assert allowed.outcome == common_pb2.ALLOW, (index, list(allowed.reasons))
    if isinstance(sealed, checkpoints_pb2.Checkpoint):
        return Round(revision, allowed.effect_id, sealed, None)
    assert sealed.grpc_code == grpc.StatusCode.FAILED_PRECONDITION, (index, sealed)
    assert sealed.reason == "REVISION_MOVED", (index, sealed)
    assert [v.type for v in sealed.violations] == ["REVISION_MOVED"], (index, sealed)
    return Round(revision, allowed.effect_id, None, int(sealed.metadata["current_revision"]))


async def test_a_seal_racing_an_authorization_never_misses_an_effect_at_its_revision(cluster):
    rng = random.Random(20240611)
    async with Stubs(cluster) as stubs:
        run_id = (await stubs.runs[0].CreateRun(runs_pb2.CreateRunRequest(), **stubs.options)).run_id
        rounds: list[Round] = []
        started = time.monotonic()
        while len(rounds) < ROUNDS_MAX:
            rounds.append(await race_round(stubs, run_id, len(rounds), rng))
            sealed = sum(1 for r in rounds if r.checkpoint is not None)
            refused = len(rounds) - sealed
            elapsed = time.monotonic() - started
            if (len(rounds) >= ROUNDS_MIN and min(sealed, refused) >= WINS_WANTED) or elapsed > RACE_SECONDS_MAX:
                break

        events = await stubs.events(run_id)
        listed = []
        page_token = ""
        while True:
            page = await stubs.checkpoints[1].ListCheckpoints(
                checkpoints_pb2.ListCheckpointsRequest(run_id=run_id, page_size=100, page_token=page_token),
                **stubs.options,
            )
            listed.extend(page.checkpoints)
            page_token = page.next_page_token
            if not page_token:
                break

    assert [e.revision for e in events] == list(range(1, len(events) + 1))
    authorized_at = {
        json.loads(e.payload_json)["effect_id"]: e.revision for e in events if e.type == "effect.authorized"
    }
    sealed_events = {json.loads(e.payload_json)["checkpoint_id"]: e for e in events if e.type == "checkpoint.sealed"}
    assert set(authorized_at) == {r.effect_id for r in rounds}

    for index, current in enumerate(rounds):
        revision = current.expected_revision
        if current.checkpoint is None:
            # Refused: the authorization committed first, and it is the current revision named.
            assert current.current_revision == revision + 1, (index, current.current_revision, revision)
            assert authorized_at[current.effect_id] == revision + 1, index
            continue
        checkpoint = current.checkpoint
        assert checkpoint.revision == revision, index
        should_hold = {effect_id for effect_id, at in authorized_at.items() if at <= revision}
        held = {e["effect_id"] for e in json.loads(checkpoint.ledger_json)["effects"]["open"]}
        missing = should_hold - held
        assert not missing, f"round {index}: checkpoint at revision {revision} misses effects {sorted(missing)}"
        assert held == should_hold, (
            f"round {index}: checkpoint at revision {revision} holds later effects {sorted(held - should_hold)}"
        )
        assert current.effect_id not in held
        assert sealed_events[checkpoint.checkpoint_id].revision == revision + 1, index
        assert authorized_at[current.effect_id] == revision + 2, index

    sealed = [r.checkpoint for r in rounds if r.checkpoint is not None]
    refused = [r for r in rounds if r.checkpoint is None]
    # A refused seal wrote nothing; every accepted one is listed and in the trace once.
    assert sorted(c.checkpoint_id for c in listed) == sorted(c.checkpoint_id for c in sealed) == sorted(sealed_events)
    # Both interleavings happened, so both branches above were checked.
    assert sealed and refused, (len(sealed), len(refused))
    print(f"\n{len(rounds)} rounds: {len(sealed)} sealed at R, {len(refused)} refused with REVISION_MOVED")
