"""Tenant quotas: what one tenant may keep at once. Each is checked before a new record is
stored (concurrent requests may pass a quota by their number); over it, RESOURCE_EXHAUSTED."""

from __future__ import annotations

from effect_ledger.errors import ResourceExhausted

RETRY_AFTER_MS = 60_000


def exceeded(quota: str, tenant_id: str, limit: int, advice: str) -> ResourceExhausted:
    return ResourceExhausted(
        f"the tenant has {limit} {quota.replace('_', ' ')}, its quota; {advice}",
        subject=f"tenants/{tenant_id}/{quota.replace('_', '-')}",
        retry_after_ms=RETRY_AFTER_MS,
        reason="QUOTA_EXCEEDED",
        metadata={"quota": quota, "limit": str(limit)},
    )
