"""Run the ``_test.rego`` files under a policy folder with the embedded engine.

Like ``opa test``: every rule whose name starts with ``test_`` in a test file must evaluate
to true. Used by ``effect-ledger policy-test`` and by ``tests/unit/test_policy_rego.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import regorus

PACKAGE_LINE = re.compile(r"^package\s+([A-Za-z0-9_.]+)", re.MULTILINE)
TEST_RULE = re.compile(r"^(test_[A-Za-z0-9_]+)\b", re.MULTILINE)


@dataclass(frozen=True)
class RegoTestResult:
    file: str
    name: str
    passed: bool
    detail: str = ""


def run_policy_tests(policy_dir: Path) -> list[RegoTestResult]:
    engine = regorus.Engine()
    sources = sorted(policy_dir.rglob("*.rego"))
    for path in sources:
        engine.add_policy(path.relative_to(policy_dir).as_posix(), path.read_text("utf-8"))
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
                value = engine.eval_rule(f"data.{package.group(1)}.{name}")
                passed, detail = value is True, "" if value is True else f"evaluated to {value!r}"
            except Exception as error:  # noqa: BLE001 - a crashing test is a failing test
                passed, detail = False, str(error)
            results.append(RegoTestResult(path.relative_to(policy_dir).as_posix(), name, passed, detail))
    return results
