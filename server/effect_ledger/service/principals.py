"""The Principals use cases: list, disable, enable, rotate a token, set its expiry.

Rules: an admin manages every principal of its own tenant; anyone may list itself and rotate
its own token. Nothing that limits a caller is decided by that caller: only an admin sets an
expiry, and a rotation by the holder keeps the expiry it had. An admin cannot disable itself.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta

from effect_ledger.domain.contracts import check_identifier
from effect_ledger.domain.model import Principal, Role
from effect_ledger.domain.tokens import new_token, token_hash
from effect_ledger.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PreconditionViolation,
)
from effect_ledger.storage import principal_store as store
from effect_ledger.storage.engine import UnitOfWork
from effect_ledger.storage.principal_store import PrincipalRecord

log = logging.getLogger(__name__)

# The longest expiry an admin may set from now (ten years): a bound, not a policy.
EXPIRY_SECONDS_MAX = 10 * 365 * 86_400


def _is_admin(principal: Principal) -> bool:
    return Role.ADMIN in principal.roles


def _require_admin(principal: Principal, action: str) -> None:
    if not _is_admin(principal):
        raise PermissionDenied(f"only an admin may {action}", reason="ROLE_REQUIRED")


async def _target(unit: UnitOfWork, caller: Principal, principal_id: str) -> PrincipalRecord:
    if not principal_id:
        raise InvalidArgument.field("principal_id", "is required", reason="FIELD_REQUIRED")
    check_identifier(principal_id, "principal_id")
    record = await store.get(unit.connection, caller.tenant_id, principal_id, lock=True)
    if record is None:
        raise NotFound("principal", principal_id)
    return record


def _audit(action: str, caller: Principal, record: PrincipalRecord) -> None:
    log.info(
        "principal %s: tenant=%s principal=%s by=%s", action, caller.tenant_id, record.principal_id, caller.principal_id
    )


async def list_principals(unit: UnitOfWork, caller: Principal, after_id: str, limit: int) -> list[PrincipalRecord]:
    if _is_admin(caller):
        return await store.listed(unit.connection, caller.tenant_id, after_id, limit)
    own = await store.get(unit.connection, caller.tenant_id, caller.principal_id)
    return [own] if own is not None and own.principal_id > after_id else []


async def disable(unit: UnitOfWork, caller: Principal, principal_id: str) -> PrincipalRecord:
    _require_admin(caller, "disable a principal")
    record = await _target(unit, caller, principal_id)
    if record.principal_id == caller.principal_id:
        raise FailedPrecondition(
            "an admin cannot disable itself",
            reason="CANNOT_DISABLE_SELF",
            violations=[PreconditionViolation("PRINCIPAL", f"principals/{principal_id}", "is the caller")],
        )
    if record.disabled_at is not None:
        return record
    await store.change(unit.connection, caller.tenant_id, principal_id, disabled_at=unit.now)
    _audit("disabled", caller, record)
    return replace(record, disabled_at=unit.now)


async def enable(unit: UnitOfWork, caller: Principal, principal_id: str) -> PrincipalRecord:
    _require_admin(caller, "enable a principal")
    record = await _target(unit, caller, principal_id)
    if record.disabled_at is None:
        return record
    await store.change(unit.connection, caller.tenant_id, principal_id, disabled_at=None)
    _audit("enabled", caller, record)
    return replace(record, disabled_at=None)


def _expiry_after(now: datetime, seconds: int, field: str) -> datetime:
    if seconds <= 0 or seconds > EXPIRY_SECONDS_MAX:
        raise InvalidArgument.field(field, f"must be between 1 and {EXPIRY_SECONDS_MAX}", reason="INVALID_EXPIRY")
    return now + timedelta(seconds=seconds)


async def rotate(
    unit: UnitOfWork, caller: Principal, principal_id: str, expires_in_seconds: int | None
) -> tuple[PrincipalRecord, str]:
    """A new token for the principal (shown once); the old one stops working at commit."""
    if principal_id != caller.principal_id:
        _require_admin(caller, "rotate another principal's token")
    if expires_in_seconds is not None:
        _require_admin(caller, "set a token's expiry")
    record = await _target(unit, caller, principal_id)
    expires_at = record.token_expires_at
    if expires_in_seconds is not None:
        expires_at = _expiry_after(unit.now, expires_in_seconds, "expires_in_seconds")
    token = new_token()
    await store.change(
        unit.connection,
        caller.tenant_id,
        principal_id,
        token_hash=token_hash(token),
        token_issued_at=unit.now,
        token_expires_at=expires_at,
    )
    _audit("token rotated", caller, record)
    return replace(record, token_issued_at=unit.now, token_expires_at=expires_at), token


async def set_expiry(
    unit: UnitOfWork, caller: Principal, principal_id: str, expires_at: datetime | None
) -> PrincipalRecord:
    """``expires_at`` None: never; in the past: the token stops working at once."""
    _require_admin(caller, "set a token's expiry")
    record = await _target(unit, caller, principal_id)
    if expires_at is not None and expires_at > unit.now + timedelta(seconds=EXPIRY_SECONDS_MAX):
        raise InvalidArgument.field("expires_at", "is too far in the future", reason="INVALID_EXPIRY")
    await store.change(unit.connection, caller.tenant_id, principal_id, token_expires_at=expires_at)
    _audit("token expiry set", caller, record)
    return replace(record, token_expires_at=expires_at)
