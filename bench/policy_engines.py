"""Compare embedded Rego engines on the shipped gate policy: per-evaluation time and agreement.

Usage: python bench/policy_engines.py [--iterations N]
regorus (gordon-to-regorus) is a dependency; regopy is measured only when installed
(`pip install regopy` in a scratch environment). Results are printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

POLICY_DIR = Path(__file__).resolve().parents[1] / "policy"
QUERY = "data.effectledger.gate.decision"

CONTRACT = {
    "tool": "email.send",
    "revision": 3,
    "effect_class": "RETRYABLE_WITH_KEY",
    "provider_idempotency": True,
    "queryable": True,
    "allowed_recovery": ["RETRY_SAME_KEY"],
    "has_arguments_schema": False,
    "max_attempts": 3,
    "lease_seconds": 60,
    "retired": False,
}
BASE = {
    "version": 1,
    "now": "2026-11-29T12:00:00.000000Z",
    "principal": {"id": "agent-1", "tenant": "acme", "roles": ["agent"]},
    "run": {"id": "run_1", "created_by": "agent-1", "revision": 4, "labels": {}},
    "request": {
        "tool": "email.send",
        "target": "mailto:bob@example.com",
        "idempotency_key": "k1",
        "intent_digest": "0" * 64,
        "arguments": {"subject": "hi", "body": "x" * 200},
    },
    "contract": CONTRACT,
    "pinned_contract": None,
    "effect": None,
    "ledger": {"verdict": "NEW_EFFECT", "creates_attempt": True, "reasons": []},
    "run_open_effects": [
        {"effect_id": f"eff_{i}", "tool": "t", "target": "x", "stage": "AUTHORIZED"} for i in range(20)
    ],
    "run_open_effects_truncated": False,
    "target_unknown_effects": [],
}
CASES = {
    "allow": BASE,
    "unknown tool": {**BASE, "contract": None},
    "retired": {**BASE, "contract": {**CONTRACT, "retired": True}},
    "irreversible": {**BASE, "contract": {**CONTRACT, "effect_class": "IRREVERSIBLE"}},
    "unknown on target": {
        **BASE,
        "target_unknown_effects": [{"effect_id": "e9", "run_id": "r", "idempotency_key": "k"}],
    },
}


def policy_texts() -> dict[str, str]:
    return {
        p.relative_to(POLICY_DIR).as_posix(): p.read_text()
        for p in sorted(POLICY_DIR.rglob("*.rego"))
        if not p.name.endswith("_test.rego")
    }


def regorus_engine():
    import regorus

    engine = regorus.Engine()
    for name, text in policy_texts().items():
        engine.add_policy(name, text)

    def evaluate(policy_input):
        engine.set_input_json(json.dumps(policy_input))
        return engine.eval_rule(QUERY)

    return evaluate


def regopy_engine():
    import regopy

    interpreter = regopy.Interpreter()
    for name, text in policy_texts().items():
        interpreter.add_module(name, text)

    def evaluate(policy_input):
        interpreter.set_input(regopy.Input(policy_input))
        output = interpreter.query(QUERY)
        if not output.ok():
            return None
        try:
            return json.loads(str(output.expressions()[0]))
        except Exception:  # noqa: BLE001 - report whatever shape comes back
            return str(output)

    return evaluate


def measure(evaluate, iterations: int) -> tuple[float, dict]:
    answers = {name: evaluate(case) for name, case in CASES.items()}
    start = time.perf_counter()
    for _ in range(iterations):
        evaluate(BASE)
    return (time.perf_counter() - start) / iterations * 1000, answers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=2000)
    options = parser.parse_args()
    rows = []
    reference = None
    for name, factory in (("regorus (gordon-to-regorus)", regorus_engine), ("regopy", regopy_engine)):
        try:
            evaluate = factory()
        except ImportError:
            rows.append((name, "not installed", "", ""))
            continue
        try:
            per_eval_ms, answers = measure(evaluate, options.iterations)
        except Exception as error:  # noqa: BLE001
            rows.append((name, "failed", str(error)[:80], ""))
            continue
        if reference is None:
            reference = answers
        outcomes = ", ".join(f"{case}={a['outcome'] if isinstance(a, dict) else a!r}" for case, a in answers.items())
        agrees = "yes" if answers == reference else "NO"
        rows.append((name, f"{per_eval_ms:.4f}", outcomes, agrees))
    print("| engine | ms per evaluation | outcomes | agrees with regorus |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
