"""The tool registry: contracts are appended as revisions, never changed in place."""

from __future__ import annotations

from dataclasses import replace

from effect_ledger.domain.contracts import check_text, check_tool_name, validate_new_contract
from effect_ledger.domain.model import Principal, ToolContract
from effect_ledger.errors import FailedPrecondition, NotFound, PreconditionViolation
from effect_ledger.storage import repository as repo
from effect_ledger.storage.engine import UnitOfWork


async def put_contract(
    unit: UnitOfWork,
    principal: Principal,
    proposed: ToolContract,
    expected_revision: int | None,
    schema_problems: list[str] | None = None,
) -> ToolContract:
    validate_new_contract(proposed, schema_problems)
    latest = await repo.latest_contract(unit.connection, principal.tenant_id, proposed.tool)
    current_revision = latest.revision if latest is not None else 0
    if expected_revision is not None and expected_revision != current_revision:
        raise FailedPrecondition(
            f"tool {proposed.tool!r} is at revision {current_revision}, not {expected_revision}",
            reason="REVISION_MISMATCH",
            violations=[
                PreconditionViolation(
                    "REVISION_MISMATCH", f"tool/{proposed.tool}", f"current revision {current_revision}"
                )
            ],
            metadata={"current_revision": str(current_revision)},
        )
    if latest is not None and latest.same_terms(replace(proposed, retired=False)) and not latest.retired:
        return latest
    contract = replace(
        proposed,
        revision=current_revision + 1,
        retired=False,
        retired_reason="",
        created_at=unit.now,
        created_by=principal.principal_id,
    )
    await repo.insert_contract(unit.connection, principal.tenant_id, contract)
    return contract


async def get_contract(unit: UnitOfWork, principal: Principal, tool: str, revision: int) -> ToolContract:
    check_tool_name(tool)
    if revision < 0:
        raise NotFound("tool", f"{tool}@{revision}")
    found = (
        await repo.contract_revision(unit.connection, principal.tenant_id, tool, revision)
        if revision
        else await repo.latest_contract(unit.connection, principal.tenant_id, tool)
    )
    if found is None:
        raise NotFound("tool", tool if not revision else f"{tool}@{revision}")
    return found


async def list_contracts(
    unit: UnitOfWork, principal: Principal, after_tool: str, page_size: int, include_retired: bool
) -> list[ToolContract]:
    return await repo.list_latest_contracts(
        unit.connection, principal.tenant_id, after_tool, page_size, include_retired
    )


async def retire_tool(unit: UnitOfWork, principal: Principal, tool: str, reason: str) -> ToolContract:
    check_tool_name(tool)
    check_text(reason, "reason", required=False, lines=True)
    latest = await repo.latest_contract(unit.connection, principal.tenant_id, tool)
    if latest is None:
        raise NotFound("tool", tool)
    if latest.retired:
        return latest
    retired = replace(
        latest,
        revision=latest.revision + 1,
        retired=True,
        retired_reason=reason,
        created_at=unit.now,
        created_by=principal.principal_id,
    )
    await repo.insert_contract(unit.connection, principal.tenant_id, retired)
    return retired
