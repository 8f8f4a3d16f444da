"""Runs and their traces."""

from __future__ import annotations

from effect_ledger.config import Limits
from effect_ledger.domain.contracts import check_identifier, check_text
from effect_ledger.domain.model import Principal, Run, RunEvent
from effect_ledger.errors import InvalidArgument, NotFound
from effect_ledger.service import retention
from effect_ledger.storage import repository as repo
from effect_ledger.storage.engine import UnitOfWork


def validate_labels(labels: dict[str, str], limits: Limits) -> None:
    if len(labels) > limits.labels_max:
        raise InvalidArgument.field("labels", f"at most {limits.labels_max} labels", reason="TOO_MANY_LABELS")
    for key, value in labels.items():
        if not key or len(key) > 63:
            raise InvalidArgument.field("labels", "keys are 1 to 63 characters", reason="INVALID_LABEL")
        check_text(key, f"labels[{key!r}]", required=True, length_max=63)
        check_text(value, f"labels[{key!r}]", required=False, length_max=256)


async def create_run(
    unit: UnitOfWork,
    principal: Principal,
    request_id: str,
    labels: dict[str, str],
    limits: Limits,
    configuration: tuple[str, str, str] = ("", "", ""),
) -> Run:
    if request_id:
        check_identifier(request_id, "request_id")
    validate_labels(labels, limits)
    for field, value in zip(("provider", "model", "adapter"), configuration, strict=True):
        check_text(value, field, required=False, length_max=128)
    if request_id:
        existing = await repo.run_by_request(unit.connection, principal.tenant_id, request_id)
        if existing is not None:
            return existing
    run_id = repo.new_id("run")
    await repo.insert_run(
        unit.connection,
        tenant_id=principal.tenant_id,
        run_id=run_id,
        created_by=principal.principal_id,
        now=unit.now,
        labels=labels,
        request_id=request_id or None,
        configuration=configuration,
    )
    provider, model, adapter = configuration
    unit.record_event(
        principal.tenant_id,
        run_id,
        "run.created",
        {
            "labels": labels,
            "request_id": request_id,
            "configuration": {"provider": provider, "model": model, "adapter": adapter},
        },
        principal.principal_id,
    )
    await unit.flush_events()
    run = await repo.get_run(unit.connection, principal.tenant_id, run_id)
    assert run is not None
    return run


async def get_run(unit: UnitOfWork, principal: Principal, run_id: str) -> Run:
    check_identifier(run_id, "run_id")
    run = await repo.get_run(unit.connection, principal.tenant_id, run_id)
    if run is None:
        raise NotFound("run", run_id)
    return run


async def list_events(
    unit: UnitOfWork, principal: Principal, run_id: str, after_revision: int, page_size: int
) -> list[RunEvent]:
    await get_run(unit, principal, run_id)
    if after_revision < 0:
        raise InvalidArgument.field("after_revision", "must not be negative")
    events = await repo.list_events(unit.connection, principal.tenant_id, run_id, after_revision, page_size)
    return await retention.with_tombstones(unit, principal.tenant_id, events)
