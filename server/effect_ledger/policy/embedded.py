"""The embedded Rego engine (regorus, through the ``gordon-to-regorus`` bindings).

Chosen with evidence (docs/decisions.md): on this machine it evaluated the gate policy in
about 0.01-0.1 ms and agreed with OPA, and it implements the builtins the policy uses
(``time.parse_rfc3339_ns`` included), where ``regopy`` took about 4 ms and returned undefined.

Policies are parsed once per load; each evaluation only sets the input. Evaluations run on the
event loop thread between two awaits, so the engine is never used by two callers at once.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import regorus

from effect_ledger.errors import PolicyUnavailable
from effect_ledger.policy.engine import (
    DECISION_PACKAGE,
    DECISION_RULE,
    PolicyDecision,
    parse_decision,
    policy_files,
    revision_of,
    undefined,
)

log = logging.getLogger(__name__)
ENGINE_NAME = "embedded-regorus"
QUERY = "data." + DECISION_PACKAGE.replace("/", ".") + "." + DECISION_RULE


def query_of(package: str) -> str:
    return "data." + package.replace("/", ".") + "." + DECISION_RULE


def load_engine(policy_dir: Path) -> tuple[regorus.Engine, str]:
    files = policy_files(policy_dir)
    if not files:
        raise SystemExit(f"no .rego policy files under {policy_dir}")
    engine = regorus.Engine()
    texts: dict[str, bytes] = {}
    for path in files:
        name = path.relative_to(policy_dir).as_posix()
        content = path.read_bytes()
        texts[name] = content
        engine.add_policy(name, content.decode("utf-8"))
    return engine, revision_of(texts)


class EmbeddedRegoEngine:
    name = ENGINE_NAME

    def __init__(self, policy_dir: Path) -> None:
        self.policy_dir = policy_dir
        self._engine, self._revision = load_engine(policy_dir)

    def reload(self) -> str:
        """Load the policy files again (SIGHUP); a broken policy keeps the previous one loaded."""
        engine, revision = load_engine(self.policy_dir)
        self._engine, self._revision = engine, revision
        log.info("policy reloaded, revision %s", revision)
        return revision

    async def revision(self) -> str:
        return self._revision

    async def evaluate(
        self, policy_input: dict[str, Any], input_json: bytes | None = None, package: str = DECISION_PACKAGE
    ) -> PolicyDecision:
        engine, revision = self._engine, self._revision
        query = QUERY if package == DECISION_PACKAGE else query_of(package)
        try:
            engine.set_input_json(input_json.decode("utf-8") if input_json is not None else json.dumps(policy_input))
            value = engine.eval_rule(query)
        except Exception as error:
            if str(error).startswith("not a valid rule path"):
                # regorus's answer when the policy has no such rule; OPA calls it undefined.
                raise undefined(f"{query} is undefined (no such rule)") from error
            # The first line only: the rest is the engine's stack trace, logged, never sent.
            log.warning("embedded policy evaluation failed: %s", error)
            first_line = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
            raise PolicyUnavailable(
                f"the embedded policy engine failed: {first_line}", metadata={"engine": ENGINE_NAME}
            ) from error
        return parse_decision(value, engine=ENGINE_NAME, revision=revision, package=package)

    async def close(self) -> None:
        return None
