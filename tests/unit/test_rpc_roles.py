"""The roles table (transport/roles.py) against the services it covers and the servicers that
enforce it: one row per RPC of every service, and each servicer method checks its own row."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import effectledger.v1
from effect_ledger.domain.model import Role
from effect_ledger.transport import roles

REPO = Path(__file__).resolve().parents[2]
TRANSPORT = REPO / "server" / "effect_ledger" / "transport"
SERVICER_MODULES = sorted(TRANSPORT.glob("servicers*.py"))


def descriptor_rpcs() -> dict[str, list[str]]:
    """Every RPC of every service the protos define: service full name -> method names."""
    found: dict[str, list[str]] = {}
    for module in pkgutil.iter_modules(effectledger.v1.__path__):
        if not module.name.endswith("_pb2"):
            continue
        loaded = importlib.import_module(f"effectledger.v1.{module.name}")
        for service in loaded.DESCRIPTOR.services_by_name.values():
            found[service.full_name] = [method.name for method in service.methods]
    return found


RPCS = descriptor_rpcs()


def test_the_table_has_a_row_for_every_rpc_and_no_other():
    described = {f"{service}/{method}" for service, methods in RPCS.items() for method in methods}
    assert described, "no services found in effectledger.v1"
    assert sorted(described - roles.RPC_ROLES.keys()) == [], "RPCs without a row in transport/roles.py"
    assert sorted(roles.RPC_ROLES.keys() - described) == [], "rows in transport/roles.py for no RPC"


def test_rows_name_roles_and_notes_read_as_sentences():
    for name, entry in roles.RPC_ROLES.items():
        assert entry.roles <= frozenset(Role), name
        assert not entry.note or (entry.note[0].isupper() and entry.note.endswith(".")), name
    # Only an RPC that refuses everyone has no role, and it says so.
    assert [n for n, e in roles.RPC_ROLES.items() if not e.roles] == [
        "effectledger.v1.Checkpoints/StoreLiveContinuation"
    ]


def test_of_returns_the_rows_roles():
    assert roles.of("Gate", "ReplayDecision") == frozenset({Role.REVIEWER, Role.ADMIN, Role.AUDITOR, Role.OPERATOR})
    assert roles.of("Budgets", "ListBudgets") == frozenset(Role)
    assert roles.of("Gate", "AuthorizeEffect") == frozenset({Role.AGENT})
    with pytest.raises(KeyError):
        roles.of("Gate", "NoSuchMethod")


# --- the servicers ---------------------------------------------------------------------------


def _roles_of(node: ast.AST) -> tuple[str, str] | None:
    """("Gate", "GetDecision") for a call roles.of("Gate", "GetDecision")."""
    if (
        isinstance(node, ast.Call)
        and ast.unparse(node.func) == "roles.of"
        and len(node.args) == 2
        and all(isinstance(a, ast.Constant) for a in node.args)
    ):
        return node.args[0].value, node.args[1].value
    return None


def _servicer_classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in SERVICER_MODULES:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Servicer"):
                found.append((path.name, node))
    return found


CLASSES = _servicer_classes()


def _service_of(node: ast.ClassDef) -> str:
    return f"{roles.PACKAGE}.{node.name.removesuffix('Servicer')}"


def test_a_servicer_class_serves_every_service():
    assert sorted(_service_of(node) for _, node in CLASSES) == sorted(RPCS)


@pytest.mark.parametrize(("module", "node"), CLASSES, ids=[node.name for _, node in CLASSES])
def test_each_servicer_method_checks_its_own_row(module, node):
    service = _service_of(node)
    methods = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    checked: dict[str, set[str]] = {}  # method -> the RPCs whose rows it reads
    for name, method in methods.items():
        for inner in ast.walk(method):
            found = _roles_of(inner)
            if found is not None:
                assert f"{roles.PACKAGE}.{found[0]}" == service, f"{module}: {name} reads {found}"
                checked.setdefault(name, set()).add(found[1])
    for name, rows in checked.items():
        if not name.startswith("_"):  # a helper serves the RPCs that call it
            assert rows == {name}, f"{module}: {node.name}.{name} reads the rows of {sorted(rows)}"
    for rpc in RPCS[service]:
        assert rpc in methods, f"{node.name} does not implement {rpc}"
        if not roles.RPC_ROLES[f"{service}/{rpc}"].roles:
            continue
        called = {
            inner.func.attr
            for inner in ast.walk(methods[rpc])
            if isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and ast.unparse(inner.func.value) == "self"
            and inner.func.attr in methods
        }
        readers = {rpc, *(helper for helper in called if helper.startswith("_"))}
        assert any(rpc in checked.get(reader, set()) for reader in readers), (
            f"{node.name}.{rpc} does not take its roles from the table (roles.of({service.rsplit('.', 1)[1]!r}, {rpc!r}))"
        )


@pytest.mark.parametrize(("module", "node"), CLASSES, ids=[node.name for _, node in CLASSES])
def test_no_servicer_passes_a_role_set_of_its_own(module, node):
    """What ``app.call`` or a fast path is given is ``roles.of(...)``, or a helper's parameter."""
    for method in node.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        parameters = {a.arg for a in method.args.args}
        for inner in ast.walk(method):
            if isinstance(inner, ast.Call) and ast.unparse(inner.func) == "self.app.call":
                given = inner.args[1]
                ok = _roles_of(given) is not None or (isinstance(given, ast.Name) and given.id in parameters)
                assert ok, f"{module}:{inner.lineno}: {ast.unparse(given)}"


# --- docs/decisions.md -------------------------------------------------------------------------


def test_the_roles_table_in_decisions_md_agrees_with_the_code():
    text = (REPO / "docs" / "decisions.md").read_text()
    block = text.split("<!-- roles-table -->", 1)[1].split("<!-- /roles-table -->", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in block.strip().splitlines()]
    header = rows[0][1:6]
    by_name = {name.split("/", 1)[1]: entry for name, entry in roles.RPC_ROLES.items()}
    for cells in rows[2:]:
        allowed = {Role(role) for role, cell in zip(header, cells[1:6], strict=True) if cell == "yes"}
        assert by_name[cells[0]].roles == allowed, cells[0]
