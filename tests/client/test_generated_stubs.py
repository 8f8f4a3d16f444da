"""The client's shipped stubs match what protos/ generates, import apart from the server's
`effectledger` package, and the client's version follows its proto package."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "clients" / "python"


def _load_generator():
    spec = importlib.util.spec_from_file_location("effect_ledger_client_generate", CLIENT / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generator = _load_generator()
SHIPPED = generator.GENERATED_ROOT


def tree(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def differences(shipped: Path, generated: Path) -> list[str]:
    expected, actual = tree(generated), tree(shipped)
    found = [f"missing from the shipped stubs: {name}" for name in sorted(expected.keys() - actual.keys())]
    found += [f"not generated from protos/: {name}" for name in sorted(actual.keys() - expected.keys())]
    found += [f"stale: {name}" for name in sorted(expected.keys() & actual.keys()) if expected[name] != actual[name]]
    return found


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("client-stubs") / "_proto"
    generator.generate(out)
    return out


def test_the_shipped_stubs_are_current(regenerated):
    assert differences(SHIPPED, regenerated) == [], "run: python clients/python/generate.py"
    names = set(tree(regenerated))
    for proto in generator.proto_files():
        stem = proto.relative_to(generator.PROTO_ROOT).with_suffix("").as_posix()
        assert {f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"} <= names


def test_a_proto_change_or_a_hand_edit_is_detected(tmp_path, regenerated):
    protos = tmp_path / "protos"
    shutil.copytree(generator.PROTO_ROOT, protos)
    common = protos / "effectledger" / "v1" / "common.proto"
    anchor = "  google.protobuf.Timestamp recorded_at = 4;\n"
    assert anchor in common.read_text()
    common.write_text(common.read_text().replace(anchor, anchor + "  string planted_extra = 99;\n", 1))
    changed = generator.generate(tmp_path / "changed", proto_root=protos)
    assert changed
    found = differences(SHIPPED, tmp_path / "changed")
    assert "stale: effectledger/v1/common_pb2.py" in found
    assert all(line.startswith("stale: effectledger/v1/common_pb2") for line in found), found

    edited = tmp_path / "edited"
    shutil.copytree(regenerated, edited)
    with (edited / "effectledger" / "v1" / "gate_pb2.py").open("a") as handle:
        handle.write("# edited by hand\n")
    (edited / "effectledger" / "v1" / "helpers.py").write_text("")
    assert differences(edited, regenerated) == [
        "not generated from protos/: effectledger/v1/helpers.py",
        "stale: effectledger/v1/gate_pb2.py",
    ]


def test_no_generated_module_imports_the_top_level_effectledger_package():
    for path in [*SHIPPED.rglob("*.py"), *SHIPPED.rglob("*.pyi")]:
        text = path.read_text()
        assert "from effectledger" not in text and "import effectledger" not in text, path


def test_the_client_imports_without_the_servers_generated_package(tmp_path):
    """In a process where `effectledger` cannot be imported at all, the client still works."""
    import subprocess

    blocker = tmp_path / "effectledger"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('the server package is not here')\n")
    code = (
        "import effect_ledger_client as c, sys\n"
        "from effect_ledger_client.proto import gate_pb2\n"
        "assert 'effectledger' not in sys.modules, sorted(sys.modules)\n"
        "print(gate_pb2.AuthorizeEffectRequest(begin_dispatched=True).begin_dispatched)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": f"{tmp_path}:{CLIENT}", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr


def test_the_version_follows_the_proto_package():
    import effect_ledger_client
    from effect_ledger_client.proto import gate_pb2

    assert effect_ledger_client.PROTO_PACKAGE == "effectledger.v1"
    package_version = effect_ledger_client.PROTO_PACKAGE.rsplit(".v", 1)[1]
    assert effect_ledger_client.__version__.split(".")[0] == package_version
    assert gate_pb2.DESCRIPTOR.package == effect_ledger_client.PROTO_PACKAGE
    for path in generator.proto_files():
        assert f"package {effect_ledger_client.PROTO_PACKAGE};" in path.read_text(), path


def protos_sha256(proto_root: Path = generator.PROTO_ROOT) -> str:
    """The digest _version.PROTOS_SHA256 records: each .proto's path, a NUL, its bytes, a NUL."""
    digest = hashlib.sha256()
    for path in generator.proto_files(proto_root):
        digest.update(path.relative_to(proto_root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def test_a_proto_change_needs_a_new_minor_version():
    """The minor version grows with the protos: protos/ must be the tree recorded for this
    version's major.minor, and each recorded version has a tree of its own."""
    from effect_ledger_client import _version

    minor = ".".join(_version.__version__.split(".")[:2])
    current = protos_sha256()
    assert minor in _version.PROTOS_SHA256, f"no protos/ digest recorded for {minor}: add {minor!r}: {current!r}"
    assert _version.PROTOS_SHA256[minor] == current, (
        f"protos/ changed since {_version.__version__}: regenerate the stubs (clients/python/generate.py), "
        f"raise the minor version in effect_ledger_client/_version.py and record its digest {current!r}"
    )
    assert len(set(_version.PROTOS_SHA256.values())) == len(_version.PROTOS_SHA256)
    assert max(_version.PROTOS_SHA256, key=lambda name: tuple(map(int, name.split(".")))) == minor


def test_the_protos_digest_sees_any_change(tmp_path):
    protos = tmp_path / "protos"
    shutil.copytree(generator.PROTO_ROOT, protos)
    assert protos_sha256(protos) == protos_sha256()
    common = protos / "effectledger" / "v1" / "common.proto"
    common.write_text(common.read_text() + "\n")
    assert protos_sha256(protos) != protos_sha256()  # an edit
    renamed = tmp_path / "renamed"
    shutil.copytree(generator.PROTO_ROOT, renamed)
    (renamed / "effectledger" / "v1" / "common.proto").rename(renamed / "effectledger" / "v1" / "common2.proto")
    assert protos_sha256(renamed) != protos_sha256()  # a rename


def test_the_distribution_ships_no_top_level_effectledger():
    text = (CLIENT / "pyproject.toml").read_text()
    assert 'include = ["effect_ledger_client*"]' in text
    assert not (CLIENT / "effectledger").exists()
