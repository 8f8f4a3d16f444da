"""The deployment's checkpoint keys: generated at the first start, shared by every server process
on the database, rotated and trusted with ``effect-ledger checkpoint-keys``.

Each test runs servers on a database of its own (the keys are the deployment's, not a tenant's).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from e2e.test_checkpoint_archives import import_archive, read_members, seal_and_export
from effect_ledger.cli import checkpoint_keys
from effect_ledger.domain.checkpoints import SIGNATURE_FILE
from support import (
    REPO,
    ServerProcess,
    Tenant,
    checkpoints_stub,
    migrate,
    new_tenant,
    raises_error,
    servers_on_fresh_database,
)


def fresh_sqlite() -> str:
    url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='el-keys-')) / 'ledger.db'}"
    migrate(url)
    return url


def verifies(public_pem: str, archive: bytes) -> bool:
    files = read_members(archive)
    key = serialization.load_pem_public_key(public_pem.encode())
    try:
        key.verify(files[SIGNATURE_FILE], files["manifest.json"])  # type: ignore[union-attr]
    except Exception:
        return False
    return True


def cli(url: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger", "checkpoint-keys", *arguments, "--database-url", url],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_two_servers_starting_together_sign_with_one_key():
    """Both processes generate at their first start if they find no key; they then agree on the
    oldest, so every export of the deployment verifies with the one public key it publishes."""
    with servers_on_fresh_database("el_keys", 2) as (url, servers, _):
        own = [k for k in checkpoint_keys(url, "list") if k["kind"] == "own"]
        assert 1 <= len(own) <= 2 and [k["state"] for k in own].count("signs") == 1
        public = checkpoint_keys(url, "export-public")[0]["public_key"]
        for server in servers:
            archive = seal_and_export(server, new_tenant(url)).archive  # a tenant each: the same keys inside
            assert verifies(public, archive)


def test_rotation_keeps_old_archives_importable_until_their_key_is_forgotten():
    url = fresh_sqlite()
    server = ServerProcess(url).start()
    try:
        before = seal_and_export(server, new_tenant(url))
        old_key = next(k for k in checkpoint_keys(url, "list") if k["state"] == "signs")

        rotated = cli(url, "rotate", "--note", "yearly rotation")
        assert rotated.returncode == 0, rotated.stderr
        states = {k["key_id"]: k["state"] for k in checkpoint_keys(url, "list")}
        assert states[old_key["key_id"]] == "retired" and list(states.values()).count("signs") == 1
        after = seal_and_export(server, new_tenant(url))  # the running server signs with the new key
        new_public = checkpoint_keys(url, "export-public")[0]["public_key"]
        assert verifies(new_public, after.archive) and not verifies(new_public, before.archive)

        # An archive signed before the rotation still imports: a retired key still verifies.
        assert import_archive(before.stub, before.archive).run_id == before.run_id
        # The signing key cannot be forgotten; the retired one can, and then its archives are
        # refused like a stranger's.
        refused = cli(url, "forget", next(k for k, s in states.items() if s == "signs"))
        assert refused.returncode != 0 and "rotate first" in refused.stderr
        assert cli(url, "forget", old_key["key_id"]).returncode == 0
        with raises_error("FAILED_PRECONDITION", "CHECKPOINT_SIGNER_UNKNOWN"):
            import_archive(before.stub, before.archive)
        assert import_archive(after.stub, after.archive).run_id == after.run_id
    finally:
        server.stop()


def test_a_deployment_accepts_another_ones_archives_once_told_to_trust_its_key():
    """Two deployments (databases) with a tenant of the same name: an archive moves between them
    only after the importing side trusts the exporting side's public key."""
    exporting_url, importing_url = fresh_sqlite(), fresh_sqlite()
    exporting, importing = ServerProcess(exporting_url).start(), ServerProcess(importing_url).start()
    try:
        source = Tenant(exporting_url, "moving-tenant")
        target = Tenant(importing_url, "moving-tenant")
        for tenant in (source, target):
            tenant.add("agent", "agent")
            tenant.add("admin", "admin")
        archive = seal_and_export(exporting, source).archive
        stub = checkpoints_stub(importing, target.tokens["agent"])
        with raises_error("FAILED_PRECONDITION", "CHECKPOINT_SIGNER_UNKNOWN"):
            import_archive(stub, archive)

        public_file = Path(tempfile.mkdtemp(prefix="el-keys-")) / "exporting.pub.pem"
        public_file.write_text(checkpoint_keys(exporting_url, "export-public")[0]["public_key"])
        trusted = cli(importing_url, "trust", str(public_file), "--note", "the exporting deployment")
        assert trusted.returncode == 0, trusted.stderr
        assert any(k["kind"] == "trusted" and k["state"] == "verifies" for k in checkpoint_keys(importing_url, "list"))
        imported = import_archive(stub, archive)
        assert imported.format_version == 2 and imported.imported_from_digest
    finally:
        exporting.stop()
        importing.stop()
