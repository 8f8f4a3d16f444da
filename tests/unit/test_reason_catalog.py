"""The reason catalog (effect_ledger/reasons.py) against the code and the policy that use it.

The service's source is read (ast) for every reason code it can answer with: the ``reason=`` of
an error or an ErrorInfo, each class's ``default_reason``, the type of a ``NotFound`` (which
makes ``<TYPE>_NOT_FOUND``), the code of a decision ``Reason``, and every other UPPER_SNAKE
literal (codes passed through helpers). The shipped Rego policy is read for the codes of its
``reason(...)`` calls. A code used and missing from the catalog fails, and so does a catalog
entry nothing uses.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from effect_ledger import errors
from effect_ledger.domain.approvals import ApprovalState
from effect_ledger.domain.model import Stage
from effect_ledger.reasons import (
    DECISION_REASONS,
    DECISIONS_BY_CODE,
    ERROR_REASONS,
    ERRORS_BY_CODE,
    Source,
)

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "server" / "effect_ledger"
POLICY = REPO / "policy"
CATALOG = SOURCE / "reasons.py"

CODE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
# A single word counts as a code only where a code is expected (INTERNAL).
WORD = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*")
TEMPLATE_PREFIX = re.compile(r"[A-Z][A-Z0-9]*_")

# Codes built from a value at run time, by their source text, with every code they can make.
TEMPLATES = {
    # lifecycle.ledger_verdict: the stage of the effect an idempotency key is bound to.
    "f'EFFECT_{stage.value}'": {f"EFFECT_{stage.value}" for stage in Stage},
    # approvals.binding_problems: an approval neither APPROVED nor CONSUMED (both have codes of
    # their own); service/approvals names the same states as PreconditionFailure types.
    "f'APPROVAL_{state.value}'": {f"APPROVAL_{state.value}" for state in ApprovalState}
    - {"APPROVAL_APPROVED", "APPROVAL_CONSUMED"},
}

# UPPER_SNAKE literals of the service that are not reason codes, beyond those the scan tells
# apart by where they stand (see Scan._not_codes), with why.
NOT_REASONS: dict[str, str] = {}

# Calls whose string arguments name something other than a reason: an environment variable, or
# a protobuf enum value (``budgets_pb2.ReservationState.Value(f"RESERVATION_{...}")``).
NAMING_CALLS = {"os.environ.get", "os.getenv", "environ.get", "Value", "Name"}

# How a call site names the class it raises: errors.X(...), X(...) or X.field(...).
ERROR_CLASSES = {
    name: value
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, errors.LedgerError)
}


@dataclass(frozen=True)
class Use:
    code: str
    kind: str  # "error", "decision" or "literal"
    where: str
    raised_as: type[errors.LedgerError] | None = None


def _call_name(call: ast.Call) -> str:
    function = call.func
    if isinstance(function, ast.Attribute):
        return function.attr
    return function.id if isinstance(function, ast.Name) else ""


def _raised_class(call: ast.Call) -> type[errors.LedgerError] | None:
    """The error class a call constructs: X(...), errors.X(...) or X.field(...)."""
    function = call.func
    if isinstance(function, ast.Attribute) and function.attr == "field":
        function = function.value
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
    return ERROR_CLASSES.get(name)


def _constants(node: ast.AST) -> list[ast.Constant]:
    """The string constants an expression can evaluate to (a literal, either arm of an if)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.IfExp):
        return _constants(node.body) + _constants(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [found for value in node.values for found in _constants(value)]
    return []


def _is_enum(node: ast.ClassDef) -> bool:
    return any(ast.unparse(base).endswith("Enum") for base in node.bases)


class Scan:
    """Every reason code the service's source uses, and the values of its enums."""

    def __init__(self) -> None:
        self.uses: list[Use] = []
        self.enum_values: set[str] = set()
        self.unknown_templates: list[str] = []
        for path in sorted(SOURCE.rglob("*.py")):
            if path != CATALOG:
                self._file(path)

    def _file(self, path: Path) -> None:
        tree = ast.parse(path.read_text(), filename=str(path))
        relative = path.relative_to(REPO).as_posix()
        seen = self._not_codes(tree)  # constants counted already, or that name something else

        def use(node: ast.Constant, code: str, kind: str, raised_as: type[errors.LedgerError] | None = None) -> None:
            seen.add(id(node))
            self.uses.append(Use(code, kind, f"{relative}:{node.lineno}", raised_as))

        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                self._class(node, relative, use, seen)
            elif isinstance(node, ast.Call):
                self._call(node, relative, use, seen)
            elif isinstance(node, ast.JoinedStr) and id(node) not in seen:
                self._template(node, relative)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in seen:
                if CODE.fullmatch(node.value):
                    self.uses.append(Use(node.value, "literal", f"{relative}:{node.lineno}"))
                for code in re.findall(r'"code"\s*:\s*"([A-Z0-9_]+)"', node.value):
                    self.uses.append(Use(code, "decision", f"{relative}:{node.lineno}"))

    @staticmethod
    def _not_codes(tree: ast.AST) -> set[int]:
        """The literals that stand where no reason code does: a keyword argument other than
        ``reason``/``code`` (``metavar="KEY_ID"``), an argument of a call in NAMING_CALLS, the
        value of a ``*_VARIABLE`` constant (an environment variable's name)."""
        found: set[int] = set()
        for node in ast.walk(tree):
            values: list[ast.AST] = []
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name in NAMING_CALLS or _call_name(node) in NAMING_CALLS:
                    values += node.args
                values += [k.value for k in node.keywords if k.arg not in ("reason", "code")]
            elif isinstance(node, ast.Assign) and all(
                isinstance(target, ast.Name) and target.id.endswith("_VARIABLE") for target in node.targets
            ):
                values.append(node.value)
            for value in values:
                found.update(id(constant) for constant in _constants(value))
                if isinstance(value, ast.JoinedStr):
                    found.add(id(value))
        return found

    def _class(self, node: ast.ClassDef, relative: str, use, seen: set[int]) -> None:
        for statement in node.body:
            if not (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)):
                continue
            value = statement.value
            if _is_enum(node):
                self.enum_values.add(str(value.value))
                seen.add(id(value))
            elif [ast.unparse(t) for t in statement.targets] == ["default_reason"] and node.name != "LedgerError":
                # LedgerError itself is never answered: transport/status.py refuses to map it.
                use(value, value.value, "error", ERROR_CLASSES[node.name])
            elif [ast.unparse(t) for t in statement.targets] == ["default_reason"]:
                seen.add(id(value))

    def _call(self, node: ast.Call, relative: str, use, seen: set[int]) -> None:
        name = _call_name(node)
        if name == "Reason" and node.args:
            for constant in _constants(node.args[0]):
                use(constant, constant.value, "decision")
            template = ast.unparse(node.args[0])
            if isinstance(node.args[0], ast.JoinedStr) and template in TEMPLATES:
                seen.add(id(node.args[0]))
                for code in sorted(TEMPLATES[template]):
                    self.uses.append(Use(code, "decision", f"{relative}:{node.lineno}"))
        if name == "NotFound" and not any(k.arg == "reason" for k in node.keywords):
            first = node.args[0]
            assert isinstance(first, ast.Constant), f"{relative}:{node.lineno}: NotFound of a computed type"
            use(first, f"{first.value.upper()}_NOT_FOUND", "error", errors.NotFound)
        for keyword in node.keywords:
            if keyword.arg == "reason":
                for constant in _constants(keyword.value):
                    if WORD.fullmatch(constant.value):
                        use(constant, constant.value, "error", _raised_class(node))

    def _template(self, node: ast.JoinedStr, relative: str) -> None:
        first = node.values[0] if node.values else None
        if not (isinstance(first, ast.Constant) and TEMPLATE_PREFIX.fullmatch(str(first.value))):
            return
        source = ast.unparse(node)
        if source not in TEMPLATES:
            self.unknown_templates.append(f"{relative}:{node.lineno}: {source}")
            return
        for code in sorted(TEMPLATES[source]):
            self.uses.append(Use(code, "literal", f"{relative}:{node.lineno}"))


@pytest.fixture(scope="module")
def scan() -> Scan:
    return Scan()


def policy_codes(package: str) -> set[str]:
    """The codes a shipped policy package gives: reason("CODE", ...) and {"code": "CODE"}."""
    folder = POLICY.joinpath(*package.split("."))
    codes: set[str] = set()
    for path in sorted(folder.glob("*.rego")):
        if path.name.endswith("_test.rego"):
            continue
        text = path.read_text()
        codes |= set(re.findall(r'\breason\("([A-Z0-9_]+)"', text))
        codes |= set(re.findall(r'"code":\s*"([A-Z0-9_]+)"', text))
    return codes


def _where(uses: list[Use]) -> list[str]:
    return sorted(f"{u.code} ({u.where})" for u in uses)


def test_each_code_is_listed_once():
    for table in (ERROR_REASONS, DECISION_REASONS):
        codes = [reason.code for reason in table]
        assert len(codes) == len(set(codes)), sorted(c for c in codes if codes.count(c) > 1)
        assert all(CODE.fullmatch(c) or WORD.fullmatch(c) for c in codes)
        assert all(reason.action.strip() for reason in table)


def test_every_error_reason_the_service_raises_is_in_the_catalog(scan):
    missing = [u for u in scan.uses if u.kind == "error" and u.code not in ERRORS_BY_CODE]
    assert _where(missing) == [], "add them to ERROR_REASONS in server/effect_ledger/reasons.py"


def test_each_error_reason_is_raised_as_the_class_the_catalog_names(scan):
    wrong = [
        f"{u.code} ({u.where}): raised as {u.raised_as.__name__}, listed as "
        f"{getattr(ERRORS_BY_CODE[u.code].error, '__name__', None)}"
        for u in scan.uses
        if u.kind == "error"
        and u.raised_as is not None
        and u.code in ERRORS_BY_CODE
        and ERRORS_BY_CODE[u.code].error is not u.raised_as
    ]
    assert wrong == []


def test_every_decision_reason_the_service_gives_is_in_the_catalog(scan):
    missing = [u for u in scan.uses if u.kind == "decision" and u.code not in DECISIONS_BY_CODE]
    assert _where(missing) == [], "add them to DECISION_REASONS in server/effect_ledger/reasons.py"


def test_every_other_code_literal_is_a_known_reason_or_not_a_reason(scan):
    known = ERRORS_BY_CODE.keys() | DECISIONS_BY_CODE.keys() | scan.enum_values | NOT_REASONS.keys()
    missing = [u for u in scan.uses if u.kind == "literal" and u.code not in known]
    assert _where(missing) == [], "a reason code belongs in reasons.py; anything else in NOT_REASONS here"


def test_codes_built_at_run_time_have_their_expansions_here(scan):
    assert scan.unknown_templates == [], "list what each can make in TEMPLATES"


@pytest.mark.parametrize("source", [Source.GATE_POLICY, Source.RECONCILE_POLICY], ids=lambda s: s.name)
def test_the_shipped_policy_reasons_match_the_catalog(source):
    package = source.policy_package
    assert package is not None
    given = policy_codes(package)
    assert given, f"no reason codes found in policy/{package.replace('.', '/')}"
    listed = {reason.code for reason in DECISION_REASONS if source in reason.sources}
    assert sorted(given - listed) == [], (
        f"codes {package} gives that DECISION_REASONS does not list under {source.name}"
    )
    assert sorted(listed - given) == [], f"codes listed under {source.name} that {package} never gives"


def test_a_reconcile_policy_refusal_is_an_error_reason_too():
    # A DENY from the reconcile policy fails ReconcileEffect with PERMISSION_DENIED whose reason is
    # the decision's first code (service/attempts.py).
    for code in policy_codes("effectledger.reconcile"):
        assert code in ERRORS_BY_CODE, code
        assert ERRORS_BY_CODE[code].error is errors.PermissionDenied, code


def test_every_catalog_entry_is_used(scan):
    used = {u.code for u in scan.uses}
    reconcile = policy_codes("effectledger.reconcile")
    unused_errors = sorted(r.code for r in ERROR_REASONS if r.code not in used | reconcile)
    assert unused_errors == [], "listed in ERROR_REASONS but raised nowhere"
    services = {Source.GATE_SERVICE, Source.RECONCILE_SERVICE}
    unused = sorted(r.code for r in DECISION_REASONS if services & set(r.sources) and r.code not in used)
    assert unused == [], "listed as the service's decision reasons but given nowhere"
