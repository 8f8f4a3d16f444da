"""The ``effect-ledger`` command: serve, migrate, principal, checkpoint-keys, verify, collect,
policy-test, and console (the reviewer's web console, from the client package).

Every flag that configures the service or names the database or the policy can also be set as
an ``EFFECT_LEDGER_<FLAG>`` environment variable (``--database-url`` ->
``EFFECT_LEDGER_DATABASE_URL``); a flag given on the command line wins. ``--help`` of each
command names the variable of each such flag, and shows the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import insert, select

from effect_ledger.config import Limits, ServerSettings
from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.contracts import check_identifier
from effect_ledger.domain.model import Role
from effect_ledger.domain.trace import walk_chain
from effect_ledger.errors import InvalidArgument
from effect_ledger.observability import logs
from effect_ledger.storage.dialect import normalize_url
from effect_ledger.storage.engine import DatabaseSettings, create_sync, default_sqlite_url
from effect_ledger.transport.workers import default_worker_count

ENV_PREFIX = "EFFECT_LEDGER_"


# The flags whose default an environment variable sets (``--help`` names it for each).
_FROM_ENVIRONMENT: set[str] = set()


def _env(name: str, default: str = "") -> str:
    _FROM_ENVIRONMENT.add(name)
    return os.environ.get(ENV_PREFIX + name.upper().replace("-", "_"), default)


class BadEnvironmentValue(Exception):
    """An ``EFFECT_LEDGER_`` variable whose value the flag it stands for cannot take."""


class _BadNumber:
    """The default of a number flag whose environment variable holds no number. Reported (exit 2)
    only when the command that has the flag runs: a bad serve variable stops neither
    ``--version`` nor ``verify``."""

    def __init__(self, name: str, kind: type[int] | type[float], text: str) -> None:
        variable = ENV_PREFIX + name.upper().replace("-", "_")
        noun = "an integer" if kind is int else "a number"
        self.problem = f"{variable}={text!r} is not {noun} (it sets --{name})"
        self.text = text

    def __str__(self) -> str:  # as --help shows the default
        return self.text


def _env_number(name: str, kind: type[int] | type[float], default: str) -> int | float:
    """The number in environment variable ``name``, or ``default`` when it is unset or empty."""
    text = _env(name) or default
    try:
        return kind(text)
    except ValueError:
        return _BadNumber(name, kind, text)  # type: ignore[return-value]  # checked after parsing


def _check_environment_numbers(options: argparse.Namespace) -> None:
    """BadEnvironmentValue for the first flag of this command left with a _BadNumber."""
    for value in vars(options).values():
        if isinstance(value, _BadNumber):
            raise BadEnvironmentValue(value.problem)


def _env_flag(name: str) -> bool:
    """A yes/no environment variable: 1, true, yes or on (any case) is yes; anything else no."""
    return _env(name).strip().lower() in ("1", "true", "yes", "on")


def _database_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=_env("database-url"),
        help="postgresql://user@host/db or sqlite:///path (default: a SQLite file under ./.effect-ledger/)",
    )


def _database_url(options: argparse.Namespace) -> str:
    return normalize_url(options.database_url or default_sqlite_url())


def _migrate(url: str) -> None:
    from effect_ledger.storage.migrate import check_durable_commits, upgrade_to_head

    engine = create_sync(DatabaseSettings(url))
    try:
        check_durable_commits(engine)
        upgrade_to_head(engine)
    finally:
        engine.dispose()


def _schema_problem(url: str, who: str = "--no-migrate") -> str | None:
    """``serve --no-migrate`` (or ``who``, a command that only reads): why the database is not
    ready to use as it is; None when it is. Only a server is refused a database that may lose
    commits."""
    from effect_ledger.storage.migrate import check_durable_commits, is_at_head

    engine = create_sync(DatabaseSettings(url))
    try:
        if who == "--no-migrate":
            check_durable_commits(engine)
        at_head, current, head = is_at_head(engine)
    finally:
        engine.dispose()
    if at_head:
        return None
    return (
        f"{who}: the database schema is at revision {current or 'none (empty database)'}, "
        f"not the newest ({head}); run `effect-ledger migrate` first"
    )


# --- serve ---------------------------------------------------------------------------------


def _build_policy(options: argparse.Namespace):
    from effect_ledger.policy.embedded import EmbeddedRegoEngine
    from effect_ledger.policy.engine import default_policy_dir
    from effect_ledger.policy.remote import RemoteOpaEngine

    log = logging.getLogger(__name__)
    if options.opa_url:
        remote = RemoteOpaEngine(options.opa_url, timeout_seconds=options.opa_timeout_seconds)

        def refresh() -> None:
            remote.reload()
            log.info(
                "SIGHUP: the policy lives in the OPA server, which loads it itself; nothing to "
                "reload here (its revision is read again on the next decision)"
            )

        return remote, refresh
    policy_dir = Path(options.policy_dir) if options.policy_dir else default_policy_dir()
    engine = EmbeddedRegoEngine(policy_dir)

    def reload() -> None:
        try:
            engine.reload()
        except Exception as error:  # noqa: BLE001 - keep serving the previous policy
            log.error("policy reload failed, previous policy kept: %s", error)

    return engine, reload


class _HangupWhileStarting:
    """SIGHUP before the event loop handles it (migrating, loading the policy, binding): its
    default action would end the process. Reloads the policy once one is loaded; before
    that there is nothing to reload (the files are read as the server starts)."""

    def __init__(self) -> None:
        self.reload: Callable[[], None] | None = None

    def install(self) -> None:
        signal.signal(signal.SIGHUP, self)

    def __call__(self, signum: int, frame: object) -> None:
        if self.reload is None:
            logging.getLogger(__name__).info("SIGHUP while starting: the policy is loaded as the server starts")
        else:
            self.reload()


def is_loopback_listen(listen: str) -> bool:
    """Whether ``--listen`` binds loopback only: 127.0.0.0/8, ::1 or ``localhost``.

    ``0.0.0.0`` and ``[::]`` (every interface), an empty host, any other name (it may resolve
    to anything) and anything unparsable are not."""
    if listen.startswith("["):
        host, bracket, _ = listen[1:].partition("]")
        if not bracket:
            return False
    else:
        host = listen.rpartition(":")[0]
        if ":" in host:  # an IPv6 address without brackets: where its port starts is a guess
            return False
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def _transport_security_problem(options: argparse.Namespace) -> str | None:
    """Why ``serve`` must not start with these TLS flags and this address; None when it may."""
    if bool(options.tls_cert) != bool(options.tls_key):
        return "--tls-cert and --tls-key come together (the certificate chain and its private key)"
    if options.tls_client_ca and not options.tls_cert:
        return "--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked over TLS only"
    if not options.tls_cert and not options.insecure and not is_loopback_listen(options.listen):
        return (
            f"refusing plaintext on {options.listen}, which is not a loopback address: give "
            "--tls-cert and --tls-key (TLS), or --insecure (EFFECT_LEDGER_INSECURE=1) to serve "
            "bearer tokens unencrypted anyway"
        )
    return None


def _limits_problem(options: argparse.Namespace) -> str | None:
    if options.requests_per_second_per_token < 0:
        return "--requests-per-second-per-token must be 0 (unlimited) or more"
    for name in (
        "request_burst_per_token",
        "streams_per_principal_max",
        "open_approval_requests_per_tenant_max",
        "artifacts_per_tenant_max",
        "snapshots_per_tenant_max",
        "maximum_concurrent_rpcs",
    ):
        if getattr(options, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    if options.calls_per_tenant_max < 0:
        return "--calls-per-tenant-max must be 0 (a quarter of --maximum-concurrent-rpcs) or more"
    if options.stream_lifetime_max_seconds <= 0:
        return "--stream-lifetime-max-seconds must be positive"
    if options.retention_age_min_seconds < 1 or options.retention_interval_seconds < 0:
        return "--retention-age-min-seconds must be at least 1 and --retention-interval-seconds 0 or more"
    return None


def _observability_problem(options: argparse.Namespace) -> str | None:
    from effect_ledger.observability.metrics import BadMetricsAddress, parse_listen
    from effect_ledger.observability.tracing import EXPORTERS

    if options.metrics_listen:
        try:
            parse_listen(options.metrics_listen)
        except BadMetricsAddress as error:
            return str(error)
    if options.metrics_sample_interval_seconds <= 0:
        return "--metrics-sample-interval-seconds must be positive"
    if options.otel_exporter not in EXPORTERS:
        return f"--otel-exporter must be one of {', '.join(EXPORTERS)}, not {options.otel_exporter!r}"
    return None


def _health_listen_problem(options: argparse.Namespace) -> str | None:
    """--health-listen must name a port other than --listen's (workers sharing both ports
    through SO_REUSEPORT would otherwise bind one port twice)."""
    if not options.health_listen:
        return None
    host, separator, port = options.health_listen.rpartition(":")
    if not separator or not host or not port.isdigit() or int(port) > 65535:
        return f"--health-listen must be HOST:PORT, not {options.health_listen!r}"
    listen_port = options.listen.rpartition(":")[2]
    if int(port) != 0 and listen_port.isdigit() and int(port) == int(listen_port):
        return f"--health-listen needs a port of its own, not --listen's ({int(port)})"
    return None


def _worker_command(options: argparse.Namespace):
    """How a supervisor starts worker ``index``: this process's own command line, then the
    flags that make it a worker (the last occurrence of a flag wins)."""

    def command(index: int, channel_fd: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "effect_ledger",
            *options.command_line,
            "--port-file",
            "",  # the supervisor writes it once every worker serves
            "--worker-index",
            str(index),
            "--worker-channel-fd",
            str(channel_fd),
        ]

    return command


def command_serve(options: argparse.Namespace) -> int:
    from effect_ledger.observability import tracing
    from effect_ledger.observability.metrics import BadMetricsAddress
    from effect_ledger.storage.engine import Database, create_async
    from effect_ledger.transport import workers
    from effect_ledger.transport.ports import CannotListen

    hangup = _HangupWhileStarting()
    hangup.install()  # first: a SIGHUP from here on never ends the process
    if not 0 <= options.workers <= workers.WORKERS_MAX:
        print(f"effect-ledger: --workers must be 0 to {workers.WORKERS_MAX}", file=sys.stderr)
        return 2
    worker_index = options.worker_index
    if (worker_index is None) != (options.worker_channel_fd is None):
        print("effect-ledger: --worker-index and --worker-channel-fd come together", file=sys.stderr)
        return 2
    problem = (
        _transport_security_problem(options)
        or _limits_problem(options)
        or _observability_problem(options)
        or _health_listen_problem(options)
    )
    if problem:
        print(f"effect-ledger: {problem}", file=sys.stderr)
        return 2
    if worker_index is None and not options.tls_cert and not is_loopback_listen(options.listen):
        # Once, by the supervisor or the lone server: workers parse the same flags.
        logging.getLogger(__name__).warning(
            "--insecure: serving plaintext on %s, which is not a loopback address; bearer tokens "
            "and effect arguments cross the network unencrypted",
            options.listen,
        )
    url = _database_url(options)
    if worker_index is None:
        # Once per start, here: workers never migrate.
        if not options.no_migrate:
            _migrate(url)
        elif problem := _schema_problem(url):
            print(f"effect-ledger: {problem}", file=sys.stderr)
            return 2
        worker_count = options.workers or workers.default_worker_count()
        if worker_count > 1:
            command = _worker_command(options)
            try:
                return workers.supervise(
                    command,
                    worker_count,
                    options.listen,
                    options.port_file,
                    options.grace_seconds,
                    metrics_listen=options.metrics_listen,
                    health_listen=options.health_listen,
                )
            except (CannotListen, BadMetricsAddress) as error:
                print(f"effect-ledger: {error}", file=sys.stderr)
                return 2
    from effect_ledger.transport.server import serve_forever  # grpc: not in a supervisor

    try:
        tracing.configure(options.otel_exporter)
    except tracing.BadExporter as error:
        print(f"effect-ledger: {error}", file=sys.stderr)
        return 2
    settings = ServerSettings(
        listen=options.listen,
        database_url=url,
        policy_dir=options.policy_dir,
        opa_url=options.opa_url,
        opa_timeout_seconds=options.opa_timeout_seconds,
        default_deadline_seconds=options.default_deadline_seconds,
        maximum_concurrent_rpcs=options.maximum_concurrent_rpcs,
        grace_seconds=options.grace_seconds,
        lease_sweep_interval_seconds=options.lease_sweep_interval_seconds,
        scheduler_interval_seconds=options.scheduler_interval_seconds,
        retention_interval_seconds=options.retention_interval_seconds,
        retention_age_min_seconds=options.retention_age_min_seconds,
        reconcile_grace_seconds=options.reconcile_grace_seconds,
        database_pool_size=options.database_pool_size,
        port_file=options.port_file,
        approval_ttl_seconds_default=options.approval_ttl_seconds_default,
        approval_ttl_seconds_max=options.approval_ttl_seconds_max,
        checkpoint_signing_key=options.checkpoint_signing_key,
        checkpoint_verification_key=options.checkpoint_verification_key,
        tls_certificate=options.tls_cert,
        tls_key=options.tls_key,
        tls_client_ca=options.tls_client_ca,
        metrics_listen=options.metrics_listen,
        metrics_sample_interval_seconds=options.metrics_sample_interval_seconds,
        health_listen=options.health_listen,
        limits=Limits(
            requests_per_second_per_token=options.requests_per_second_per_token,
            request_burst_per_token=options.request_burst_per_token,
            streams_per_principal_max=options.streams_per_principal_max,
            calls_per_tenant_max=options.calls_per_tenant_max or max(1, options.maximum_concurrent_rpcs // 4),
            stream_lifetime_max_seconds=options.stream_lifetime_max_seconds,
            open_approval_requests_per_tenant_max=options.open_approval_requests_per_tenant_max,
            artifacts_per_tenant_max=options.artifacts_per_tenant_max,
            snapshots_per_tenant_max=options.snapshots_per_tenant_max,
        ),
    )
    policy, reload = _build_policy(options)
    hangup.reload = reload

    async def main() -> None:
        database = Database(create_async(DatabaseSettings(url, pool_size=settings.database_pool_size)))
        if worker_index is None:
            await serve_forever(settings, database, policy, reload)
        else:
            channel_fd = options.worker_channel_fd
            await workers.serve_worker(settings, database, policy, reload, worker_index, channel_fd)

    try:
        asyncio.run(main())
    except (CannotListen, BadMetricsAddress) as error:
        print(f"effect-ledger: {error}", file=sys.stderr)
        return 2
    finally:
        tracing.shutdown()  # exports the spans still buffered
    return 0


# --- migrate, principal add ----------------------------------------------------------------


def command_migrate(options: argparse.Namespace) -> int:
    _migrate(_database_url(options))
    print("database is at the newest schema")
    return 0


def add_principal(url: str, tenant: str, principal_id: str, roles: list[str]) -> str:
    """Store a principal with a new bearer token; returns the token (stored only as its hash)."""
    from effect_ledger.domain.tokens import new_token, token_hash
    from effect_ledger.storage.schema import principals

    check_identifier(tenant, "tenant")
    check_identifier(principal_id, "id")
    role_values = sorted({Role(role).value for role in roles})
    token = new_token()
    engine = create_sync(DatabaseSettings(url))
    try:
        with engine.begin() as connection:
            exists = connection.execute(
                select(principals.c.principal_id).where(
                    principals.c.tenant_id == tenant, principals.c.principal_id == principal_id
                )
            ).first()
            if exists is not None:
                raise SystemExit(f"principal {principal_id!r} already exists in tenant {tenant!r}")
            connection.execute(
                insert(principals).values(
                    tenant_id=tenant,
                    principal_id=principal_id,
                    token_hash=token_hash(token),
                    roles=canonical_bytes(role_values).decode(),
                    created_at=datetime.now(UTC),
                )
            )
    finally:
        engine.dispose()
    return token


def set_roles(url: str, tenant: str, principal_id: str, roles: list[str]) -> None:
    from sqlalchemy import update

    from effect_ledger.storage.schema import principals

    role_values = sorted({Role(role).value for role in roles})
    engine = create_sync(DatabaseSettings(url))
    try:
        with engine.begin() as connection:
            changed = connection.execute(
                update(principals)
                .where(principals.c.tenant_id == tenant, principals.c.principal_id == principal_id)
                .values(roles=canonical_bytes(role_values).decode())
            ).rowcount
    finally:
        engine.dispose()
    if changed != 1:
        raise SystemExit(f"no principal {principal_id!r} in tenant {tenant!r}")


def _warn_about_roles(principal_id: str, roles: list[str]) -> None:
    """One principal that both executes effects and approves them weakens four eyes."""
    if {Role.AGENT.value, Role.REVIEWER.value} <= set(roles):
        print(
            f"effect-ledger: warning: {principal_id!r} holds both the agent and the reviewer role; "
            "its approvals never count for effects it executes itself (four eyes), so another "
            "reviewer must approve those",
            file=sys.stderr,
        )


def command_principal_add(options: argparse.Namespace) -> int:
    url = _database_url(options)
    _migrate(url)
    try:
        token = add_principal(url, options.tenant, options.id, options.role)
    except (InvalidArgument, ValueError) as error:
        print(f"effect-ledger: {error}", file=sys.stderr)
        return 2
    _warn_about_roles(options.id, options.role)
    print(token)
    print(
        f"# principal {options.id!r} in tenant {options.tenant!r} with roles {sorted(set(options.role))}; "
        "the token is shown once and stored only as its hash",
        file=sys.stderr,
    )
    return 0


def command_principal_set_roles(options: argparse.Namespace) -> int:
    set_roles(_database_url(options), options.tenant, options.id, options.role)
    _warn_about_roles(options.id, options.role)
    print(f"roles of {options.id!r} are now {sorted(set(options.role))}")
    return 0


def principal_tokens(
    url: str,
    tenant: str,
    action: str,
    principal_id: str = "",
    expires_at: datetime | None = None,
    expires_in_seconds: int | None = None,
    never: bool = False,
    subject: str | None = None,
) -> tuple[list[dict[str, str]], str]:
    """list, disable, enable, rotate, expire or bind principals' tokens of a tenant, directly in the
    database (an operator's tool: no admin token needed). Returns the principals it touched
    (or all, for list) and the new token of a rotation."""
    from effect_ledger.domain.tokens import new_token, token_hash
    from effect_ledger.storage import principal_store as store
    from effect_ledger.storage.engine import Database, create_async

    check_identifier(tenant, "tenant")
    if action != "list":
        check_identifier(principal_id, "id")

    async def work(unit):  # type: ignore[no-untyped-def]
        if action == "list":
            return await store.listed(unit.connection, tenant, "", 100_000), ""
        record = await store.get(unit.connection, tenant, principal_id, lock=True)
        if record is None:
            raise SystemExit(f"no principal {principal_id!r} in tenant {tenant!r}")
        token = ""
        if action == "disable":
            await store.change(unit.connection, tenant, principal_id, disabled_at=unit.now)
        elif action == "enable":
            await store.change(unit.connection, tenant, principal_id, disabled_at=None)
        elif action == "rotate":
            token = new_token()
            values = {"token_hash": token_hash(token), "token_issued_at": unit.now}
            if expires_in_seconds is not None:
                values["token_expires_at"] = unit.now + timedelta(seconds=expires_in_seconds)
            await store.change(unit.connection, tenant, principal_id, **values)
        elif action == "bind":
            await store.change(unit.connection, tenant, principal_id, client_subject=subject or None)
        elif action == "expire":
            when = (
                None
                if never
                else expires_at
                or (unit.now + timedelta(seconds=expires_in_seconds) if expires_in_seconds is not None else unit.now)
            )
            await store.change(unit.connection, tenant, principal_id, token_expires_at=when)
        return [await store.get(unit.connection, tenant, principal_id)], token

    async def main():  # type: ignore[no-untyped-def]
        database = Database(create_async(DatabaseSettings(url)))
        try:
            return await database.run(work)
        finally:
            await database.dispose()

    records, token = asyncio.run(main())

    def shown(moment: datetime | None) -> str:
        return moment.isoformat() if moment is not None else ""

    rows = [
        {
            "principal_id": r.principal_id,
            "roles": ",".join(sorted(role.value for role in r.roles)),
            "disabled_at": shown(r.disabled_at),
            "token_expires_at": shown(r.token_expires_at),
            "token_issued_at": shown(r.token_issued_at or r.created_at),
            "client_subject": r.client_subject or "",
        }
        for r in records
        if r is not None
    ]
    return rows, token


def command_principal_tokens(options: argparse.Namespace) -> int:
    expires_at = None
    if getattr(options, "at", None):
        try:
            expires_at = datetime.fromisoformat(options.at)
        except ValueError:
            print(f"effect-ledger: --at {options.at!r} is not an ISO 8601 instant", file=sys.stderr)
            return 2
        if expires_at.tzinfo is None:
            print("effect-ledger: --at needs a time zone (for example 2027-01-01T00:00:00+00:00)", file=sys.stderr)
            return 2
    subject = getattr(options, "subject", None)
    if subject is not None and (not subject or len(subject.encode()) > 1024 or not subject.isprintable()):
        print("effect-ledger: --subject must be 1 to 1024 bytes of printable text", file=sys.stderr)
        return 2
    seconds = getattr(options, "in_seconds", None)
    if seconds is not None and seconds <= 0:
        print("effect-ledger: --in-seconds must be positive", file=sys.stderr)
        return 2
    try:
        rows, token = principal_tokens(
            _database_url(options),
            options.tenant,
            options.principal_command,
            getattr(options, "id", "") or "",
            expires_at,
            seconds,
            getattr(options, "never", False),
            getattr(options, "subject", None),
        )
    except InvalidArgument as error:
        print(f"effect-ledger: {error}", file=sys.stderr)
        return 2
    for row in rows:
        print(
            f"{row['principal_id']}\troles={row['roles']}\tdisabled_at={row['disabled_at'] or '-'}"
            f"\ttoken_expires_at={row['token_expires_at'] or 'never'}\ttoken_issued_at={row['token_issued_at']}"
            f"\tclient_subject={row['client_subject'] or '-'}"
        )
    if token:
        print(token)
        print("# the new token is shown once; the old one no longer works", file=sys.stderr)
    return 0


# --- checkpoint keys -----------------------------------------------------------------------


def checkpoint_keys(url: str, action: str, argument: str = "", note: str = "") -> list[dict[str, str]]:
    """list, rotate, trust (a public key file of another deployment) or forget (a key id)."""
    from effect_ledger.domain import signing
    from effect_ledger.storage import key_store
    from effect_ledger.storage.engine import Database, create_async

    trusted = signing.public_key(Path(argument).read_bytes(), source=argument) if action == "trust" else None

    async def work(unit):  # type: ignore[no-untyped-def]
        if action == "rotate":
            await key_store.rotate(unit.connection, unit.now, note or "rotated")
        elif trusted is not None:
            key_id, pem = trusted
            await key_store.add(
                unit.connection,
                key_id=key_id,
                public_key=pem,
                private_key=None,
                note=note or f"trusted from {Path(argument).name}",
                now=unit.now,
            )
        elif action == "forget":
            keys = await key_store.list_keys(unit.connection)
            signer = key_store.active(keys)
            if signer is not None and signer.key_id == argument:
                raise SystemExit(f"key {argument} signs exports; rotate first, then forget it")
            if not await key_store.forget(unit.connection, argument):
                raise SystemExit(f"no checkpoint key {argument!r}")
        elif action == "export-public":
            key = await key_store.ensure_signing_key(unit.connection, unit.now)
            return [{"public_key": key.public_key}]
        keys = await key_store.list_keys(unit.connection)
        signer = key_store.active(keys)
        return [
            {
                "key_id": key.key_id,
                "kind": "own" if key.own else "trusted",
                "state": "signs" if key is signer else ("retired" if key.own else "verifies"),
                "created_at": key.created_at.isoformat(),
                "retired_at": key.retired_at.isoformat() if key.retired_at else "",
                "note": key.note,
            }
            for key in keys
        ]

    async def main() -> list[dict[str, str]]:
        database = Database(create_async(DatabaseSettings(url)))
        try:
            return await database.run(work)
        finally:
            await database.dispose()

    return asyncio.run(main())


def command_checkpoint_keys(options: argparse.Namespace) -> int:
    url = _database_url(options)
    _migrate(url)
    argument = getattr(options, "argument", "")
    try:
        rows = checkpoint_keys(url, options.keys_command, argument, getattr(options, "note", ""))
    except (InvalidArgument, OSError) as error:
        print(f"effect-ledger: {error}", file=sys.stderr)
        return 2
    if options.keys_command == "export-public":
        print(rows[0]["public_key"], end="")
        return 0
    for row in rows:
        print(json.dumps(row, sort_keys=True))
    return 0


# --- verify --------------------------------------------------------------------------------


def verify_chains(url: str) -> list[str]:
    """Walk every run's hash chain; one line per run whose chain is broken."""
    return verify_report(url)[0]


def verify_report(url: str) -> tuple[list[str], list[str]]:
    """Walk every run's hash chain: (one line per broken run, one line per run with events
    whose payload retention removed, each vouched for by its tombstone)."""
    from effect_ledger.storage.retention_store import tombstones_of_run_sync
    from effect_ledger.storage.schema import run_events, runs

    engine = create_sync(DatabaseSettings(url))
    problems, removed = [], []
    try:
        with engine.connect() as connection:
            if connection.dialect.name == "postgresql":
                # One snapshot for the whole walk. Under READ COMMITTED each statement sees the
                # latest commits, so a run appended to between reading its head and reading its
                # events looked broken ("run head is revision N; the chain ends at N+1").
                connection.execution_options(isolation_level="REPEATABLE READ")
            for run in connection.execute(select(runs).order_by(runs.c.tenant_id, runs.c.run_id)).all():
                rows = connection.execute(
                    select(run_events)
                    .where(run_events.c.tenant_id == run.tenant_id, run_events.c.run_id == run.run_id)
                    .order_by(run_events.c.revision)
                ).all()
                events = [
                    {
                        "revision": row.revision,
                        "type": row.type,
                        "payload": json.loads(row.payload),
                        "principal_id": row.principal_id,
                        "created_at": row.created_at,
                        "prev_hash": row.prev_hash,
                        "hash": row.hash,
                    }
                    for row in rows
                ]
                tombstones = tombstones_of_run_sync(connection, run.tenant_id, run.run_id)
                walked = walk_chain(run.tenant_id, run.run_id, events, run.revision, run.head_hash, tombstones)
                found = walked.chain_break
                if found is not None:
                    problems.append(
                        f"tenant {run.tenant_id} run {found.run_id} revision {found.revision}: {found.problem}"
                    )
                if walked.removed_by_retention:
                    removed.append(
                        f"tenant {run.tenant_id} run {run.run_id}: {walked.removed_by_retention} event(s) "
                        "removed by retention (each matches its tombstone)"
                    )
    finally:
        engine.dispose()
    return problems, removed


def command_verify(options: argparse.Namespace) -> int:
    url = _database_url(options)
    if problem := _schema_problem(url, "verify"):  # verify reads only: it never migrates
        print(f"effect-ledger: {problem}", file=sys.stderr)
        return 2
    problems, removed = verify_report(url)
    for line in removed:
        print(line)
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} run(s) with a broken hash chain", file=sys.stderr)
        return 1
    print("every run's hash chain verifies")
    return 0


# --- collect -------------------------------------------------------------------------------


def collect_retention(url: str, tenant_id: str, dry_run: bool) -> dict[str, int]:
    """Run the retention collector now: one tenant, or every tenant that has a rule."""
    from effect_ledger.domain.retention import COLLECTOR, Kind
    from effect_ledger.service import retention
    from effect_ledger.storage.engine import Database, create_async

    async def main() -> dict[str, int]:
        database = Database(create_async(DatabaseSettings(url)))
        try:
            if tenant_id:
                counts = await retention.collect(
                    database, tenant_id, COLLECTOR, dry_run=dry_run, batches_max=COLLECT_BATCHES_MAX
                )
            else:
                counts = await retention.collect_every_tenant(
                    database, dry_run=dry_run, batches_per_tenant_max=COLLECT_BATCHES_MAX
                )
        finally:
            await database.dispose()
        found = {kind.value.lower(): counts.removed[kind] for kind in Kind}
        return {**found, "tombstones_written": counts.tombstones_written, "more": int(counts.more)}

    return asyncio.run(main())


# A command-line collection goes on until nothing collectable is left (up to a billion rows).
COLLECT_BATCHES_MAX = 1_000_000


def command_collect(options: argparse.Namespace) -> int:
    url = _database_url(options)
    _migrate(url)
    if options.tenant:
        try:
            check_identifier(options.tenant, "tenant")
        except InvalidArgument as error:
            print(f"effect-ledger: {error}", file=sys.stderr)
            return 2
    counts = collect_retention(url, options.tenant, options.dry_run)
    print(json.dumps({"dry_run": options.dry_run, **counts}, sort_keys=True))
    return 0


def command_policy_test(options: argparse.Namespace) -> int:
    from effect_ledger.policy.engine import default_policy_dir
    from effect_ledger.policy.rego_tests import run_policy_tests

    policy_dir = Path(options.policy_dir) if options.policy_dir else default_policy_dir()
    try:
        results = run_policy_tests(policy_dir, options.engine)
    except ImportError:
        print("effect-ledger: OPA's engine is not installed (pip install opa-golib-python-bindings)", file=sys.stderr)
        return 2
    for result in results:
        print(
            f"{'PASS' if result.passed else 'FAIL'} [{options.engine}] {result.file}: {result.name} {result.detail[:200]}"
        )
    failed = sum(not r.passed for r in results)
    print(f"{options.engine}: {len(results) - failed} passed, {failed} failed")
    return 1 if failed or not results else 0


# --- console -------------------------------------------------------------------------------

CONSOLE_INSTALL = "pip install './clients/python[console]'"


def command_console(options: argparse.Namespace) -> int:
    """The reviewer's console (effect_ledger_client.console), with the arguments after ``console``."""
    try:
        # What the console imports as it starts: the client package, and the extra's packages
        # (uvicorn; starlette, jinja2, sse-starlette and python-multipart through the app).
        import uvicorn  # noqa: F401

        import effect_ledger_client  # noqa: F401
        from effect_ledger_client.console import app  # noqa: F401
        from effect_ledger_client.console.serve import main as console_main
    except ImportError as error:
        if (error.name or "").startswith("effect_ledger_client."):
            raise  # the client package is there but broken: not a missing extra
        print(
            f"effect-ledger: the console needs the client package with its console extra (no module "
            f"{error.name!r}); install it from the repository's root: {CONSOLE_INSTALL}",
            file=sys.stderr,
        )
        return 2
    return console_main(options.console_arguments)


# --- the parser ----------------------------------------------------------------------------


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default, unless its help already says what the default is or it has none
    worth showing (an empty string, None, a switch that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in ("", None, False) or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def _document_environment(parser: argparse.ArgumentParser) -> None:
    """For ``parser`` and each of its subcommands, at any depth: show defaults (_HelpFormatter)
    and append its environment variable to the help of each flag that reads one."""
    parser.formatter_class = _HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subcommand in dict.fromkeys(action.choices.values()):  # each once (aliases)
                _document_environment(subcommand)
            continue
        name = next((o for o in action.option_strings if o.startswith("--")), None)
        if name is None or action.help is argparse.SUPPRESS or name[2:] not in _FROM_ENVIRONMENT:
            continue
        variable = ENV_PREFIX + name[2:].upper().replace("-", "_")
        action.help = f"{action.help or ''} (env {variable})".lstrip()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("effect-ledger")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from effect_ledger import __version__

        return __version__


def _observability_arguments(serve: argparse.ArgumentParser) -> None:
    """Logs, metrics and traces (docs/observability.md). ``--log-level`` and ``--log-format`` are
    also taken before the command; given after ``serve``, they win."""
    group = serve.add_argument_group("observability", "logs, metrics and traces (docs/observability.md)")
    # No defaults of their own: when not given here, the values before the command apply (and
    # those default to the environment variables).
    group.add_argument(
        "--log-level",
        dest="serve_log_level",
        metavar="LOG_LEVEL",
        default=None,
        help="DEBUG, INFO (one access line per call), WARNING or ERROR (default INFO)",
    )
    group.add_argument(
        "--log-format",
        dest="serve_log_format",
        metavar="LOG_FORMAT",
        choices=logs.LOG_FORMATS,
        default=None,
        help="text, or json: one JSON object a line, the server's own lines and its libraries' alike (default text)",
    )
    group.add_argument(
        "--metrics-listen",
        default=_env("metrics-listen"),
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any free port, logged); "
        "off by default; with --workers the supervisor serves every worker's",
    )
    group.add_argument(
        "--metrics-sample-interval-seconds",
        type=float,
        default=_env_number("metrics-sample-interval-seconds", float, "15"),
        help="how often the open effects and pending approval requests per tenant are counted in the database",
    )
    group.add_argument(
        "--otel-exporter",
        default=_env("otel-exporter", "none"),
        choices=("none", "console", "otlp"),
        help="OpenTelemetry traces: none, console (spans to standard output) or otlp (configured by the "
        "standard OTEL_EXPORTER_OTLP_* variables)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="effect-ledger", description="The effect ledger and final gate.")
    parser.add_argument("--version", action="version", version=f"effect-ledger {_version()}")
    parser.add_argument("--log-level", default=_env("log-level", "INFO"), help="DEBUG, INFO, WARNING or ERROR")
    parser.add_argument("--log-format", default=_env("log-format", "text"), help="text or json: one JSON object a line")
    commands = parser.add_subparsers(dest="command")

    serve = commands.add_parser(
        "serve",
        help="run the gRPC server (applies migrations first)",
        formatter_class=_HelpFormatter,
        description="Run the gRPC server. Every flag can also be set by the environment variable named after it.",
    )
    _database_argument(serve)
    serve.add_argument("--listen", default=_env("listen", "127.0.0.1:50051"), help="host:port to serve on")
    serve.add_argument(
        "--health-listen",
        default=_env("health-listen"),
        metavar="HOST:PORT",
        help="also serve grpc.health.v1 alone on HOST:PORT, for probes: plaintext, no token, no admission "
        "limits, so a flood of --listen never refuses it (port 0: any free port, logged); bind it to "
        "loopback or the pod network, never publish it; off by default; with --workers every worker serves it",
    )
    serve.add_argument(
        "--no-migrate",
        action="store_true",
        default=_env_flag("no-migrate"),
        help="do not apply migrations at start: refuse to start (exit 2) unless the database is "
        "already at the newest schema (run `effect-ledger migrate` as a separate job)",
    )
    serve.add_argument("--policy-dir", default=_env("policy-dir"), help="Rego policy folder (default: packaged)")
    serve.add_argument("--opa-url", default=_env("opa-url"), help="evaluate with a real OPA server instead")
    serve.add_argument("--opa-timeout-seconds", type=float, default=_env_number("opa-timeout-seconds", float, "0.5"))
    serve.add_argument(
        "--default-deadline-seconds", type=float, default=_env_number("default-deadline-seconds", float, "10")
    )
    serve.add_argument(
        "--maximum-concurrent-rpcs", type=int, default=_env_number("maximum-concurrent-rpcs", int, "256")
    )
    serve.add_argument("--grace-seconds", type=float, default=_env_number("grace-seconds", float, "10"))
    serve.add_argument(
        "--lease-sweep-interval-seconds", type=float, default=_env_number("lease-sweep-interval-seconds", float, "1")
    )
    serve.add_argument(
        "--scheduler-interval-seconds",
        type=float,
        default=_env_number("scheduler-interval-seconds", float, "1"),
        help="how often this process fires the scheduled intents that are due (0: never)",
    )
    serve.add_argument(
        "--retention-interval-seconds",
        type=float,
        default=_env_number("retention-interval-seconds", float, "0"),
        help="how often the retention collector runs over every tenant (0: never; docs/retention.md)",
    )
    serve.add_argument(
        "--retention-age-min-seconds",
        type=int,
        default=_env_number("retention-age-min-seconds", int, "3600"),
        help="the shortest max_age_seconds a retention rule may have",
    )
    serve.add_argument(
        "--reconcile-grace-seconds",
        type=float,
        default=_env_number("reconcile-grace-seconds", float, "-1"),
        help="how long after a lease ends only its owner may settle it not_happened (default: the lease length)",
    )
    serve.add_argument(
        "--database-pool-size",
        type=int,
        default=_env_number("database-pool-size", int, "10"),
        help="database connections per server process: each of the --workers has a pool this size",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=_env_number("workers", int, "0"),
        help="server processes sharing the listening port (SO_REUSEPORT), each with its own event loop "
        "and database pool, under one supervisor; 0 (the default): one per CPU this process may use "
        f"({default_worker_count()} here); 1: a single process and no supervisor",
    )
    # Set by the supervisor on the workers it starts; not for people.
    serve.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--worker-channel-fd", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--port-file", default=_env("port-file"), help="write the bound port here")
    _observability_arguments(serve)
    serve.add_argument(
        "--approval-ttl-seconds-default", type=int, default=_env_number("approval-ttl-seconds-default", int, "3600")
    )
    serve.add_argument(
        "--approval-ttl-seconds-max", type=int, default=_env_number("approval-ttl-seconds-max", int, "604800")
    )
    serve.add_argument(
        "--checkpoint-signing-key",
        default=_env("checkpoint-signing-key"),
        help="Ed25519 private key (PEM) that signs exports",
    )
    serve.add_argument(
        "--checkpoint-verification-key",
        default=_env("checkpoint-verification-key"),
        help="Ed25519 public key (PEM); imports must be signed by its pair",
    )
    serve.add_argument("--tls-cert", default=_env("tls-cert"), help="the server's certificate chain (PEM): serve TLS")
    serve.add_argument("--tls-key", default=_env("tls-key"), help="the private key of --tls-cert (PEM, unencrypted)")
    serve.add_argument(
        "--tls-client-ca",
        default=_env("tls-client-ca"),
        help="CA certificates (PEM): every client must present a certificate one of them signed (mTLS)",
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        default=_env_flag("insecure"),
        help="allow plaintext on a non-loopback --listen address (refused without it; loopback "
        "addresses are always allowed plaintext)",
    )
    defaults = Limits()
    limits = serve.add_argument_group(
        "limits",
        "per server process unless named per tenant (docs/threat-model.md); each has its EFFECT_LEDGER_ variable",
    )
    limits.add_argument(
        "--requests-per-second-per-token",
        type=float,
        default=_env_number("requests-per-second-per-token", float, str(defaults.requests_per_second_per_token)),
        help="calls a second one bearer token may make (token bucket; 0: unlimited)",
    )
    limits.add_argument(
        "--request-burst-per-token",
        type=int,
        default=_env_number("request-burst-per-token", int, str(defaults.request_burst_per_token)),
        help="calls one token may make at once before the rate applies",
    )
    limits.add_argument(
        "--streams-per-principal-max",
        type=int,
        default=_env_number("streams-per-principal-max", int, str(defaults.streams_per_principal_max)),
        help="open streams (WatchApprovals, ExportCheckpoint, ImportCheckpoint) per principal",
    )
    limits.add_argument(
        "--calls-per-tenant-max",
        type=int,
        default=_env_number("calls-per-tenant-max", int, "0"),
        help="calls (streams included) one tenant runs at once, counted once its token is checked "
        "(0: a quarter of --maximum-concurrent-rpcs)",
    )
    limits.add_argument(
        "--stream-lifetime-max-seconds",
        type=float,
        default=_env_number("stream-lifetime-max-seconds", float, str(defaults.stream_lifetime_max_seconds)),
        help="the longest a stream lives (WatchApprovals then ends and the client resumes from its cursor)",
    )
    limits.add_argument(
        "--open-approval-requests-per-tenant-max",
        type=int,
        default=_env_number(
            "open-approval-requests-per-tenant-max", int, str(defaults.open_approval_requests_per_tenant_max)
        ),
        help="a tenant's pending approval requests at once",
    )
    limits.add_argument(
        "--artifacts-per-tenant-max",
        type=int,
        default=_env_number("artifacts-per-tenant-max", int, str(defaults.artifacts_per_tenant_max)),
        help="a tenant's stored artifacts (deleted ones not counted)",
    )
    limits.add_argument(
        "--snapshots-per-tenant-max",
        type=int,
        default=_env_number("snapshots-per-tenant-max", int, str(defaults.snapshots_per_tenant_max)),
        help="a tenant's recorded snapshots",
    )
    serve.set_defaults(handler=command_serve)

    migrate = commands.add_parser("migrate", help="apply database migrations")
    _database_argument(migrate)
    migrate.set_defaults(handler=command_migrate)

    principal = commands.add_parser("principal", help="manage principals")
    principal_commands = principal.add_subparsers(dest="principal_command", required=True)
    for name, handler, help_text in (
        ("add", command_principal_add, "add a principal and print its bearer token once"),
        ("set-roles", command_principal_set_roles, "replace a principal's roles"),
    ):
        sub = principal_commands.add_parser(name, help=help_text)
        _database_argument(sub)
        sub.add_argument("--tenant", required=True)
        sub.add_argument("--id", required=True)
        sub.add_argument("--role", action="append", required=True, choices=[r.value for r in Role])
        sub.set_defaults(handler=handler)
    for name, help_text in (
        ("list", "list a tenant's principals: roles, disabled, token expiry"),
        ("disable", "refuse the principal's token from its next call, on every replica"),
        ("enable", "accept the principal's token again"),
        ("rotate", "issue a new token (printed once); the old one stops working at once"),
        ("expire", "set when the token stops working: now (default), --at, --in-seconds, or --never"),
        ("bind", "accept the token only over mTLS from a client certificate of this subject (--subject), or --clear"),
    ):
        sub = principal_commands.add_parser(name, help=help_text)
        _database_argument(sub)
        sub.add_argument("--tenant", required=True)
        if name != "list":
            sub.add_argument("--id", required=True)
        if name == "rotate":
            sub.add_argument(
                "--in-seconds", dest="in_seconds", type=int, default=None, help="the new token expires after this"
            )
        if name == "expire":
            when = sub.add_mutually_exclusive_group()
            when.add_argument("--at", default="", help="an ISO 8601 instant with a time zone")
            when.add_argument("--in-seconds", dest="in_seconds", type=int, default=None)
            when.add_argument("--never", action="store_true")
        if name == "bind":
            which = sub.add_mutually_exclusive_group(required=True)
            which.add_argument(
                "--subject", default=None, help="the certificate subject, RFC 2253 (e.g. 'CN=agent-7,O=Example')"
            )
            which.add_argument("--clear", action="store_true", help="no binding: the token works from any peer")
        sub.set_defaults(handler=command_principal_tokens)

    keys = commands.add_parser(
        "checkpoint-keys",
        help="the deployment's checkpoint signing keys (kept in the database): list, rotate, trust, forget",
    )
    keys_commands = keys.add_subparsers(dest="keys_command", required=True)
    for name, help_text in (
        ("list", "list the keys: the one that signs, retired ones (still verify), trusted keys of others"),
        ("rotate", "a new key signs exports from now on; the previous one is retired and still verifies"),
        ("trust", "accept archives signed by another deployment (its public key, PEM: `export-public` there)"),
        ("forget", "stop accepting archives signed by a key (by key id); the signing key cannot be forgotten"),
        ("export-public", "print the public key that signs this deployment's exports (PEM)"),
    ):
        sub = keys_commands.add_parser(name, help=help_text)
        _database_argument(sub)
        if name in ("trust", "forget"):
            sub.add_argument("argument", metavar="PUBLIC_KEY_PEM" if name == "trust" else "KEY_ID")
        if name in ("rotate", "trust"):
            sub.add_argument("--note", default="", help="a note kept with the key")
        sub.set_defaults(handler=command_checkpoint_keys)

    verify = commands.add_parser("verify", help="walk every run's hash chain")
    _database_argument(verify)
    verify.set_defaults(handler=command_verify)

    collect = commands.add_parser(
        "collect", help="run the retention collector now (docs/retention.md): every tenant with a rule, or one"
    )
    _database_argument(collect)
    collect.add_argument("--tenant", default="", help="only this tenant")
    collect.add_argument("--dry-run", action="store_true", help="count what would be removed; remove nothing")
    collect.set_defaults(handler=command_collect)

    policy_test = commands.add_parser("policy-test", help="run the policy's _test.rego files")
    policy_test.add_argument("--policy-dir", default=_env("policy-dir"), help="Rego policy folder (default: packaged)")
    policy_test.add_argument(
        "--engine",
        choices=["embedded", "opa"],
        default="embedded",
        help="embedded: the server's own engine; opa: OPA's own Go engine (what a real OPA server runs)",
    )
    policy_test.set_defaults(handler=command_policy_test)

    console = commands.add_parser(
        "console",
        add_help=False,  # `console --help` is the console's own help
        help="run the reviewer's web console (effect-ledger-console, from the client package's console "
        "extra; docs/console.md); every argument after `console` is the console's: `console --help` lists them",
    )
    console.set_defaults(handler=command_console)
    _document_environment(parser)
    return parser


def _console_split(command_line: list[str]) -> tuple[list[str], list[str]] | None:
    """``[--log-level L] console ARGS...`` -> (the part up to ``console``, ARGS); None for any
    other command. ARGS are the console's own, passed on as they are (its --help too)."""
    index = 0
    while index < len(command_line) and command_line[index].startswith("-"):
        option = command_line[index]
        index += 1 if "=" in option or option in ("-h", "--help", "--version") else 2
    if index < len(command_line) and command_line[index] == "console":
        return command_line[: index + 1], command_line[index + 1 :]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    command_line = list(sys.argv[1:] if argv is None else argv)
    console = _console_split(command_line)
    options = parser.parse_args(console[0] if console else command_line)
    options.console_arguments = console[1] if console else []
    if options.command is None:
        options = parser.parse_args(["serve", *(argv or [])])
        command_line = [*command_line, "serve"]
    try:
        _check_environment_numbers(options)
    except BadEnvironmentValue as error:
        print(f"effect-ledger: {error}", file=sys.stderr)
        return 2
    try:
        logs.configure(
            getattr(options, "serve_log_format", None) or options.log_format,
            getattr(options, "serve_log_level", None) or options.log_level,
            worker=getattr(options, "worker_index", None),
        )
    except logs.BadLogSetting as error:
        print(f"effect-ledger: {error}", file=sys.stderr)
        return 2
    # A supervisor starts its workers with the same command line (serve --workers).
    options.command_line = command_line
    return options.handler(options)


if __name__ == "__main__":
    sys.exit(main())
