"""The committed generated code under server/effectledger matches what protos/ generates."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from effect_ledger.tools.genproto import (
    GENERATED_PACKAGE,
    PROTO_ROOT,
    REPO_ROOT,
    generate,
    proto_files,
)

COMMITTED = REPO_ROOT / "server" / GENERATED_PACKAGE


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root (bytecode caches aside), by relative path."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def differences(committed: Path, generated: Path) -> list[str]:
    """What differs between two generated trees: files missing, extra, or with other bytes."""
    expected, actual = tree(generated), tree(committed)
    found = [f"missing from the committed tree: {name}" for name in sorted(expected.keys() - actual.keys())]
    found += [f"not generated from protos/: {name}" for name in sorted(actual.keys() - expected.keys())]
    found += [f"stale: {name}" for name in sorted(expected.keys() & actual.keys()) if expected[name] != actual[name]]
    return found


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    generate(out)
    return out / GENERATED_PACKAGE


def test_the_committed_generated_code_is_current(regenerated):
    assert differences(COMMITTED, regenerated) == [], "run: python -m effect_ledger.tools.genproto"
    names = set(tree(regenerated))
    for proto in proto_files():
        stem = proto.relative_to(PROTO_ROOT / GENERATED_PACKAGE).with_suffix("").as_posix()
        assert {f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"} <= names


def test_a_proto_change_without_regeneration_is_detected(tmp_path, regenerated):
    protos = tmp_path / "protos"
    shutil.copytree(PROTO_ROOT, protos)
    common = protos / "effectledger" / "v1" / "common.proto"
    text = common.read_text()
    anchor = "  google.protobuf.Timestamp recorded_at = 4;\n"
    assert anchor in text
    common.write_text(text.replace(anchor, anchor + "  string planted_extra = 99;\n", 1))
    out = tmp_path / "out"
    out.mkdir()
    generate(out, proto_root=protos)
    found = differences(COMMITTED, out / GENERATED_PACKAGE)
    assert "stale: v1/common_pb2.py" in found
    assert "stale: v1/common_pb2.pyi" in found
    assert all(name.startswith("stale: v1/common_pb2") for name in found), found


def test_a_hand_edit_or_a_stray_file_is_detected(tmp_path, regenerated):
    copy = tmp_path / GENERATED_PACKAGE
    shutil.copytree(regenerated, copy)
    with (copy / "v1" / "gate_pb2.py").open("a") as handle:
        handle.write("# edited by hand\n")
    (copy / "v1" / "helpers.py").write_text("")
    (copy / "v1" / "runs_pb2.pyi").unlink()
    assert differences(copy, regenerated) == [
        "missing from the committed tree: v1/runs_pb2.pyi",
        "not generated from protos/: v1/helpers.py",
        "stale: v1/gate_pb2.py",
    ]
