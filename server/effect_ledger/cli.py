"""The ``effect-ledger`` command: serve, migrate, principal add, checkpoint-keys, verify, policy-test.

Every flag can also be set as an ``EFFECT_LEDGER_<FLAG>`` environment variable
(``--database-url`` -> ``EFFECT_LEDGER_DATABASE_URL``); a flag given on the command line wins.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import sys
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import insert, select

from effect_ledger.config import ServerSettings
from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.domain.contracts import check_identifier
from effect_ledger.domain.model import Role
from effect_ledger.domain.trace import first_break
from effect_ledger.errors import InvalidArgument
from effect_ledger.storage.dialect import normalize_url
from effect_ledger.storage.engine import DatabaseSettings, create_sync, default_sqlite_url
from effect_ledger.transport.workers import default_worker_count

ENV_PREFIX = "EFFECT_LEDGER_"


def _env(name: str, default: str = "") -> str:
    return os.environ.get(ENV_PREFIX + name.upper().replace("-", "_"), default)


def _database_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=_env("database-url"),
        help="postgresql://user@host/db or sqlite:///path (default: a SQLite file under ./.effect-ledger/)",
    )


def _database_url(options: argparse.Namespace) -> str:
    return normalize_url(options.database_url or default_sqlite_url())


def _migrate(url: str):
    from effect_ledger.storage.migrate import check_durable_commits, upgrade_to_head

    engine = create_sync(DatabaseSettings(url))
    try:
        check_durable_commits(engine)
        upgrade_to_head(engine)
    finally:
        engine.dispose()


# --- serve ---------------------------------------------------------------------------------


def _build_policy(options: argparse.Namespace):
    from effect_ledger.policy.embedded import EmbeddedRegoEngine
    from effect_ledger.policy.engine import default_policy_dir
    from effect_ledger.policy.remote import RemoteOpaEngine

    if options.opa_url:
        return RemoteOpaEngine(options.opa_url, timeout_seconds=options.opa_timeout_seconds), None
    policy_dir = Path(options.policy_dir) if options.policy_dir else default_policy_dir()
    engine = EmbeddedRegoEngine(policy_dir)

    def reload() -> None:
        try:
            engine.reload()
        except Exception as error:  # noqa: BLE001 - keep serving the previous policy
            logging.getLogger(__name__).error("policy reload failed, previous policy kept: %s", error)

    return engine, reload


def _worker_command(options: argparse.Namespace):
    """How a supervisor starts worker ``index``: this process's own command line, then the
    flags that make it a worker (the last occurrence of a flag wins)."""

    def command(index: int, channel_fd: int) -> list[str]:
        return [
            sys.executable, "-m", "effect_ledger", *options.command_line,
            "--port-file", "",  # the supervisor writes it once every worker serves
            "--worker-index", str(index),
            "--worker-channel-fd", str(channel_fd),
        ]

    return command


def command_serve(options: argparse.Namespace) -> int:
    from effect_ledger.storage.engine import Database, create_async
    from effect_ledger.transport import workers
    from effect_ledger.transport.server import serve_forever

    if not 0 <= options.workers <= workers.WORKERS_MAX:
        print(f"effect-ledger: --workers must be 0 to {workers.WORKERS_MAX}", file=sys.stderr)
        return 2
    worker_index = options.worker_index
    if (worker_index is None) != (options.worker_channel_fd is None):
        print("effect-ledger: --worker-index and --worker-channel-fd come together", file=sys.stderr)
        return 2
    url = _database_url(options)
    if worker_index is None:
        _migrate(url)  # once per start, here: workers never migrate
        worker_count = options.workers or workers.default_worker_count()
        if worker_count > 1:
            command = _worker_command(options)
            return workers.supervise(command, worker_count, options.listen, options.port_file, options.grace_seconds)
    else:
        labelled = logging.Formatter(_log_format(f"[worker {worker_index} pid {os.getpid()}] "))
        for handler in logging.getLogger().handlers:
            handler.setFormatter(labelled)
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
        reconcile_grace_seconds=options.reconcile_grace_seconds,
        database_pool_size=options.database_pool_size,
        port_file=options.port_file,
        approval_ttl_seconds_default=options.approval_ttl_seconds_default,
        approval_ttl_seconds_max=options.approval_ttl_seconds_max,
        checkpoint_signing_key=options.checkpoint_signing_key,
        checkpoint_verification_key=options.checkpoint_verification_key,
    )
    policy, reload = _build_policy(options)

    async def main() -> None:
        database = Database(create_async(DatabaseSettings(url, pool_size=settings.database_pool_size)))
        if worker_index is None:
            await serve_forever(settings, database, policy, reload)
        else:
            channel_fd = options.worker_channel_fd
            await workers.serve_worker(settings, database, policy, reload, worker_index, channel_fd)

    asyncio.run(main())
    return 0


# --- migrate, principal add ----------------------------------------------------------------


def command_migrate(options: argparse.Namespace) -> int:
    _migrate(_database_url(options))
    print("database is at the newest schema")
    return 0


def add_principal(url: str, tenant: str, principal_id: str, roles: list[str]) -> str:
    """Store a principal with a new bearer token; returns the token (stored only as its hash)."""
    from effect_ledger.storage.schema import principals
    from effect_ledger.transport.servicers import token_hash

    check_identifier(tenant, "tenant")
    check_identifier(principal_id, "id")
    role_values = sorted({Role(role).value for role in roles})
    token = "elt_" + secrets.token_urlsafe(32)
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
                    created_at=datetime.now(timezone.utc),
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
            await key_store.add(unit.connection, key_id=key_id, public_key=pem, private_key=None,
                                note=note or f"trusted from {Path(argument).name}", now=unit.now)
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
    from effect_ledger.storage.schema import run_events, runs

    engine = create_sync(DatabaseSettings(url))
    problems = []
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
                found = first_break(run.tenant_id, run.run_id, events, run.revision, run.head_hash)
                if found is not None:
                    problems.append(
                        f"tenant {run.tenant_id} run {found.run_id} revision {found.revision}: {found.problem}"
                    )
    finally:
        engine.dispose()
    return problems


def command_verify(options: argparse.Namespace) -> int:
    problems = verify_chains(_database_url(options))
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} run(s) with a broken hash chain", file=sys.stderr)
        return 1
    print("every run's hash chain verifies")
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
        print(f"{'PASS' if result.passed else 'FAIL'} [{options.engine}] {result.file}: {result.name} {result.detail[:200]}")
    failed = sum(not r.passed for r in results)
    print(f"{options.engine}: {len(results) - failed} passed, {failed} failed")
    return 1 if failed or not results else 0


# --- the parser ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="effect-ledger", description="The effect ledger and final gate.")
    parser.add_argument("--log-level", default=_env("log-level", "INFO"))
    commands = parser.add_subparsers(dest="command")

    serve = commands.add_parser("serve", help="run the gRPC server (applies migrations first)")
    _database_argument(serve)
    serve.add_argument("--listen", default=_env("listen", "127.0.0.1:50051"))
    serve.add_argument("--policy-dir", default=_env("policy-dir"), help="Rego policy folder (default: packaged)")
    serve.add_argument("--opa-url", default=_env("opa-url"), help="evaluate with a real OPA server instead")
    serve.add_argument("--opa-timeout-seconds", type=float, default=float(_env("opa-timeout-seconds", "0.5")))
    serve.add_argument("--default-deadline-seconds", type=float, default=float(_env("default-deadline-seconds", "10")))
    serve.add_argument("--maximum-concurrent-rpcs", type=int, default=int(_env("maximum-concurrent-rpcs", "256")))
    serve.add_argument("--grace-seconds", type=float, default=float(_env("grace-seconds", "10")))
    serve.add_argument("--lease-sweep-interval-seconds", type=float, default=float(_env("lease-sweep-interval-seconds", "1")))
    serve.add_argument(
        "--reconcile-grace-seconds", type=float, default=float(_env("reconcile-grace-seconds", "-1")),
        help="how long after a lease ends only its owner may settle it not_happened (default: the lease length)",
    )
    serve.add_argument(
        "--database-pool-size", type=int, default=int(_env("database-pool-size", "10")),
        help="database connections per server process: each of the --workers has a pool this size",
    )
    serve.add_argument(
        "--workers", type=int, default=int(_env("workers", "0")),
        help="server processes sharing the listening port (SO_REUSEPORT), each with its own event loop "
        "and database pool, under one supervisor; 0 (the default): one per CPU this process may use "
        f"({default_worker_count()} here); 1: a single process and no supervisor",
    )
    # Set by the supervisor on the workers it starts; not for people.
    serve.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--worker-channel-fd", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--port-file", default=_env("port-file"), help="write the bound port here")
    serve.add_argument("--approval-ttl-seconds-default", type=int, default=int(_env("approval-ttl-seconds-default", "3600")))
    serve.add_argument("--approval-ttl-seconds-max", type=int, default=int(_env("approval-ttl-seconds-max", "604800")))
    serve.add_argument("--checkpoint-signing-key", default=_env("checkpoint-signing-key"), help="Ed25519 private key (PEM) that signs exports")
    serve.add_argument("--checkpoint-verification-key", default=_env("checkpoint-verification-key"), help="Ed25519 public key (PEM); imports must be signed by its pair")
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

    policy_test = commands.add_parser("policy-test", help="run the policy's _test.rego files")
    policy_test.add_argument("--policy-dir", default=_env("policy-dir"))
    policy_test.add_argument(
        "--engine", choices=["embedded", "opa"], default="embedded",
        help="embedded: the server's default engine; opa: OPA's own Go engine (what a real OPA server runs)",
    )
    policy_test.set_defaults(handler=command_policy_test)
    return parser


def _log_format(label: str = "") -> str:
    return f"%(asctime)s %(levelname)s {label}%(name)s %(message)s"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    command_line = list(sys.argv[1:] if argv is None else argv)
    options = parser.parse_args(command_line)
    logging.basicConfig(
        level=getattr(logging, str(options.log_level).upper(), logging.INFO),
        format=_log_format(),
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if options.command is None:
        options = parser.parse_args(["serve", *(argv or [])])
        command_line = [*command_line, "serve"]
    # A supervisor starts its workers with the same command line (serve --workers).
    options.command_line = command_line
    return options.handler(options)


if __name__ == "__main__":
    sys.exit(main())
