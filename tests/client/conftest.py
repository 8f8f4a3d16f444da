"""Clients of the client distribution, over real channels to the session's server per backend."""

from __future__ import annotations

import pytest

from effect_ledger_client import Ledger
from effect_ledger_client.proto import common_pb2, runs_pb2
from support import contract

IRREVERSIBLE_TOOL = "payment.wire"


def ledger_for(server, tenant, principal_id: str, **options) -> Ledger:
    return Ledger(server.target, tenant.tokens[principal_id], **options)


@pytest.fixture
def ledger(server, tenant):
    """The tenant's agent."""
    with ledger_for(server, tenant, "agent") as client:
        yield client


@pytest.fixture
def admin_ledger(server, tenant):
    with ledger_for(server, tenant, "admin") as client:
        yield client


@pytest.fixture
def reviewer_ledger(server, tenant):
    with ledger_for(server, tenant, "reviewer") as client:
        yield client


@pytest.fixture
def run_id(ledger) -> str:
    return ledger.runs.CreateRun(runs_pb2.CreateRunRequest()).run_id


def register(admin_ledger: Ledger, tool: str = "email.send", **fields) -> None:
    """A tool contract; without RETRY_SAME_KEY unless asked, so an uncertain effect stops the gate."""
    admin_ledger.tools.PutToolContract(contract(tool, **fields))


def register_irreversible(admin_ledger: Ledger, tool: str = IRREVERSIBLE_TOOL) -> None:
    """The shipped policy asks for an approval before any effect of an IRREVERSIBLE tool."""
    register(admin_ledger, tool, effect_class=common_pb2.IRREVERSIBLE, provider_idempotency=False, max_attempts=1)
