"""Configuration: command-line flags, then EFFECT_LEDGER_* environment variables, then defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Limits on everything a client can send or ask for (TigerStyle: every bound is named)."""

    arguments_size_max_bytes: int = 64 * 1024
    receipt_detail_size_max_bytes: int = 64 * 1024
    message_size_max_bytes: int = 4 * 1024 * 1024
    page_size_default: int = 100
    page_size_max: int = 500
    events_page_size_default: int = 200
    events_page_size_max: int = 1000
    run_open_effects_in_policy_max: int = 20
    target_unknown_effects_in_policy_max: int = 20
    labels_max: int = 32
    lease_sweep_batch_max: int = 100
    # Streams (WatchApprovals, ExportCheckpoint, ImportCheckpoint) open at once per principal,
    # per server process; and the longest any stream lives (WatchApprovals then ends normally
    # and the client resumes from its cursor; the others end with DEADLINE_EXCEEDED).
    streams_per_principal_max: int = 8
    # Calls (streams included) one tenant runs at once per server process, counted from the
    # moment its token is checked: a quarter of the default --maximum-concurrent-rpcs (256), so
    # one tenant's slow calls leave three quarters of the process to the others, and it takes
    # four tenants at their cap to fill it. `serve` sets a quarter of its own
    # --maximum-concurrent-rpcs unless --calls-per-tenant-max is given.
    calls_per_tenant_max: int = 64
    stream_lifetime_max_seconds: float = 300.0
    # Calls per second per bearer token (token buckets, per server process; 0: unlimited),
    # and the burst a caller may spend at once.
    requests_per_second_per_token: float = 500.0
    request_burst_per_token: int = 1000
    # Tenant quotas: what one tenant may keep at once (checked before each new one is stored;
    # concurrent requests may pass a quota by their number).
    open_approval_requests_per_tenant_max: int = 10_000
    artifacts_per_tenant_max: int = 100_000
    snapshots_per_tenant_max: int = 100_000


@dataclass(frozen=True)
class ServerSettings:
    listen: str = "127.0.0.1:50051"
    database_url: str = ""
    policy_dir: str = ""
    opa_url: str = ""
    opa_timeout_seconds: float = 0.5
    # A call that brings no deadline gets this one.
    default_deadline_seconds: float = 10.0
    # gRPC-level concurrency ceiling; beyond it calls get RESOURCE_EXHAUSTED at once.
    maximum_concurrent_rpcs: int = 256
    grace_seconds: float = 10.0
    lease_sweep_interval_seconds: float = 1.0
    # Every server process looks for scheduled intents that are due this often (0: never; a
    # deployment needs at least one process that does).
    scheduler_interval_seconds: float = 1.0
    # The retention collector runs over every tenant this often (0: never; CollectRetention and
    # `effect-ledger collect` run it on demand), and the shortest rule an admin may set.
    retention_interval_seconds: float = 0.0
    retention_age_min_seconds: int = 3600
    # With PostgreSQL's autovacuum off, stale planner statistics are refreshed and tables with
    # many dead rows vacuumed this often (by one worker per host).
    statistics_interval_seconds: float = 5.0
    # ReconcileEffect(not_happened) from anyone but an attempt's owner waits this long after the
    # attempt's lease ends (a late sender may still be in flight). Negative: the attempt's own
    # lease length (its tool contract's lease_seconds), the default.
    reconcile_grace_seconds: float = -1.0
    health_check_interval_seconds: float = 1.0
    database_pool_size: int = 10
    port_file: str = ""
    # Approvals expire after this long unless the request asks for less (or more, up to the max).
    approval_ttl_seconds_default: int = 3600
    approval_ttl_seconds_max: int = 7 * 86_400
    # Ed25519 keys (PEM files): exports are signed with the first; with the second configured,
    # an import must carry a manifest signature that verifies.
    checkpoint_signing_key: str = ""
    checkpoint_verification_key: str = ""
    # TLS (PEM files): the server's certificate chain and its private key; with a client CA as
    # well, every client must present a certificate that CA signed (mTLS). Without them the
    # port speaks plaintext, which `serve` allows on a loopback address only unless --insecure.
    tls_certificate: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    # Prometheus metrics on HOST:PORT (empty: off); the ledger's gauges (open effects, pending
    # approval requests) are sampled from the database this often, by one process per host.
    metrics_listen: str = ""
    metrics_sample_interval_seconds: float = 15.0
    # grpc.health.v1 alone on HOST:PORT as well (empty: off): plaintext, no guard, for probes
    # (see transport/server.py, serve_health_port).
    health_listen: str = ""
    limits: Limits = Limits()
