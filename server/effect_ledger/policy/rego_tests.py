"""Run the ``_test.rego`` files under a policy folder, on the embedded engine or on OPA's.

Like ``opa test``: every rule whose name starts with ``test_`` in a test file must evaluate
to true. Used by ``effect-ledger policy-test`` and by ``tests/unit/test_policy_rego.py``.

Engines: ``embedded`` (regorus, what the server runs by default) and ``opa`` (OPA's own Go
engine, as a real OPA server runs the policy, through the ``opa_bindings`` package of
opa-golib-python-bindings; the test command installs it, see scripts/test.sh).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regorus

PACKAGE_LINE = re.compile(r"^package\s+([A-Za-z0-9_.]+)", re.MULTILINE)
TEST_RULE = re.compile(r"^(test_[A-Za-z0-9_]+)\b", re.MULTILINE)


@dataclass(frozen=True)
class RegoTestResult:
    file: str
    name: str
    passed: bool
    detail: str = ""


ENGINES = ("embedded", "opa")


def rule_evaluator(policy_dir: Path, engine: str) -> Callable[[str, Any], Any]:
    """Load every ``.rego`` file under ``policy_dir`` into ``engine``; returns a function that
    evaluates a rule (``data.a.b.rule``) for an input (None: no input) and raises when the
    rule is undefined or evaluation fails."""
    sources = sorted(policy_dir.rglob("*.rego"))
    if engine == "embedded":
        embedded = regorus.Engine()
        for path in sources:
            embedded.add_policy(path.relative_to(policy_dir).as_posix(), path.read_text("utf-8"))

        def evaluate_embedded(rule: str, value: Any) -> Any:
            embedded.set_input_json(json.dumps(value) if value is not None else "{}")
            return embedded.eval_rule(rule)

        return evaluate_embedded
    if engine == "opa":
        from opa_bindings import OpaEngine  # only where OPA's engine is installed

        opa = OpaEngine()
        for path in sources:
            opa.add_policy(path.relative_to(policy_dir).as_posix(), path.read_text("utf-8"))

        def evaluate_opa(rule: str, value: Any) -> Any:
            return opa.eval_document(rule.removeprefix("data."), value)

        return evaluate_opa
    raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")


def run_policy_tests(policy_dir: Path, engine: str = "embedded") -> list[RegoTestResult]:
    evaluate = rule_evaluator(policy_dir, engine)
    sources = sorted(policy_dir.rglob("*.rego"))
    results: list[RegoTestResult] = []
    for path in sources:
        if not path.name.endswith("_test.rego"):
            continue
        text = path.read_text("utf-8")
        package = PACKAGE_LINE.search(text)
        if package is None:
            results.append(RegoTestResult(path.name, "<package>", False, "no package line"))
            continue
        for name in dict.fromkeys(TEST_RULE.findall(text)):
            try:
                value = evaluate(f"data.{package.group(1)}.{name}", None)
                passed, detail = value is True, "" if value is True else f"evaluated to {value!r}"
            except Exception as error:  # noqa: BLE001 - a crashing test is a failing test
                passed, detail = False, str(error)
            results.append(RegoTestResult(path.relative_to(policy_dir).as_posix(), name, passed, detail))
    return results
