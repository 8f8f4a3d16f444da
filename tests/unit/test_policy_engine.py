"""Decision parsing, policy revisions and the embedded Rego engine over the shipped policy."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from effect_ledger.domain.lifecycle import LedgerVerdict, VerdictKind
from effect_ledger.domain.model import (
    EffectClass,
    Outcome,
    Principal,
    Reason,
    Recovery,
    Role,
    Run,
    ToolContract,
)
from effect_ledger.domain.policy_input import build_policy_input
from effect_ledger.errors import PolicyUnavailable
from effect_ledger.policy.embedded import ENGINE_NAME, EmbeddedRegoEngine
from effect_ledger.policy.engine import REASONS_MAX, parse_decision, policy_files, revision_of

REPO = Path(__file__).resolve().parents[2]
POLICY_DIR = REPO / "policy"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def parse(value):
    return parse_decision(value, engine="test-engine", revision="rev-1")


# --- parse_decision ---------------------------------------------------------------------------


def test_an_allow_without_reasons_is_valid():
    decision = parse({"outcome": "ALLOW", "reasons": []})
    assert (decision.outcome, decision.reasons, decision.engine, decision.revision) == (
        Outcome.ALLOW,
        (),
        "test-engine",
        "rev-1",
    )
    assert parse({"outcome": "ALLOW"}).reasons == ()


def test_a_deny_keeps_its_reasons_sorted_and_deduplicated():
    decision = parse(
        {
            "outcome": "DENY",
            "reasons": [
                {"code": "TOOL_UNKNOWN", "message": "no contract"},
                {"code": "ROLE_NOT_AGENT", "message": "not an agent"},
                {"code": "TOOL_UNKNOWN", "message": "no contract"},
            ],
        }
    )
    assert decision.outcome == Outcome.DENY
    assert decision.reasons == (
        Reason("ROLE_NOT_AGENT", "not an agent"),
        Reason("TOOL_UNKNOWN", "no contract"),
    )


def test_require_approval_and_long_or_missing_messages():
    decision = parse(
        {
            "outcome": "REQUIRE_APPROVAL",
            "reasons": [{"code": "C" * 200, "message": "m" * 2000}, {"code": "B"}],
        }
    )
    assert decision.outcome == Outcome.REQUIRE_APPROVAL
    assert decision.reasons == (Reason("B", ""), Reason("C" * 128, "m" * 1024))


UNDEFINED = [
    ("undefined", None),
    ("a string", "ALLOW"),
    ("a list", [{"outcome": "ALLOW"}]),
    ("a boolean", True),
    ("no outcome", {"reasons": []}),
    ("unknown outcome", {"outcome": "MAYBE", "reasons": []}),
    ("lower-case outcome", {"outcome": "allow", "reasons": []}),
    ("DUPLICATE is the ledger's", {"outcome": "DUPLICATE", "reasons": [{"code": "X"}]}),
    (
        "RECONCILE_REQUIRED is the ledger's",
        {"outcome": "RECONCILE_REQUIRED", "reasons": [{"code": "X"}]},
    ),
    ("DENY without reasons", {"outcome": "DENY", "reasons": []}),
    ("DENY with reasons absent", {"outcome": "DENY"}),
    ("REQUIRE_APPROVAL without reasons", {"outcome": "REQUIRE_APPROVAL", "reasons": []}),
    ("reasons not a list", {"outcome": "DENY", "reasons": {"code": "X"}}),
    ("a reason not an object", {"outcome": "DENY", "reasons": ["X"]}),
    ("a reason without code", {"outcome": "DENY", "reasons": [{"message": "m"}]}),
    ("a reason with a numeric code", {"outcome": "DENY", "reasons": [{"code": 7}]}),
    (
        "too many reasons",
        {"outcome": "DENY", "reasons": [{"code": f"R{n}"} for n in range(REASONS_MAX + 1)]},
    ),
    ("ALLOW with a malformed reason", {"outcome": "ALLOW", "reasons": [{"code": None}]}),
]


@pytest.mark.parametrize("value", [case[1] for case in UNDEFINED], ids=[case[0] for case in UNDEFINED])
def test_anything_but_a_valid_decision_is_policy_undefined(value):
    with pytest.raises(PolicyUnavailable) as caught:
        parse(value)
    assert caught.value.reason == "POLICY_UNDEFINED"
    assert caught.value.metadata["detail"]


def test_the_reason_limit_itself_is_accepted():
    decision = parse({"outcome": "DENY", "reasons": [{"code": f"R{n:02}"} for n in range(REASONS_MAX)]})
    assert len(decision.reasons) == REASONS_MAX


# --- revisions ----------------------------------------------------------------------------------


def test_revision_does_not_depend_on_dict_order():
    forward = {"a.rego": b"package a", "b/c.rego": b"package c"}
    backward = {"b/c.rego": b"package c", "a.rego": b"package a"}
    assert revision_of(forward) == revision_of(backward)
    assert len(revision_of(forward)) == 64


def test_revision_changes_when_a_file_changes_is_renamed_added_or_removed():
    base = {"a.rego": b"package a", "b.rego": b"package b"}
    revisions = {
        revision_of(base),
        revision_of({**base, "a.rego": b"package a "}),
        revision_of({"a2.rego": b"package a", "b.rego": b"package b"}),
        revision_of({**base, "c.rego": b"package c"}),
        revision_of({"a.rego": b"package a"}),
    }
    assert len(revisions) == 5


def test_policy_files_exclude_tests(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "p.rego").write_text("package x")
    (tmp_path / "x" / "p_test.rego").write_text("package x_test")
    (tmp_path / "notes.md").write_text("")
    assert policy_files(tmp_path) == [tmp_path / "x" / "p.rego"]


# --- the embedded engine over the shipped policy --------------------------------------------------

CONTRACT = ToolContract(
    tool="email.send",
    revision=3,
    effect_class=EffectClass.RETRYABLE_WITH_KEY,
    provider_idempotency=True,
    queryable=True,
    allowed_recovery=(Recovery.RETRY_SAME_KEY,),
    arguments_schema=None,
    max_attempts=3,
    lease_seconds=60,
)


def policy_input(*, contract: ToolContract | None = CONTRACT, roles=frozenset({Role.AGENT}), tool="email.send"):
    return build_policy_input(
        now=NOW,
        principal=Principal("acme", "agent-1", roles),
        run=Run("acme", "run_1", "agent-1", NOW, 4, "h" * 64, {}),
        tool=tool,
        target="mailto:bob@example.com",
        idempotency_key="k1",
        arguments={"subject": "hi"},
        intent_digest="d" * 64,
        contract=contract,
        pinned_contract=None,
        effect=None,
        verdict=LedgerVerdict(VerdictKind.NEW_EFFECT),
        run_open_effects=[],
        run_open_effects_limit=100,
        target_unknown_effects=[],
        estimate={},
        requested_estimate={},
        budgets=[],
        approvals=[],
    )


@pytest.fixture(scope="module")
def engine():
    return EmbeddedRegoEngine(POLICY_DIR)


async def test_the_shipped_policy_allows_a_registered_tool_for_an_agent(engine):
    decision = await engine.evaluate(policy_input())
    assert decision.outcome == Outcome.ALLOW and decision.reasons == ()
    assert decision.engine == ENGINE_NAME


async def test_the_shipped_policy_denies_an_unknown_tool(engine):
    decision = await engine.evaluate(policy_input(contract=None, tool="nobody.knows"))
    assert decision.outcome == Outcome.DENY
    assert [r.code for r in decision.reasons] == ["TOOL_UNKNOWN"]


async def test_the_shipped_policy_denies_a_principal_without_the_agent_role(engine):
    decision = await engine.evaluate(policy_input(roles=frozenset({Role.AUDITOR})))
    assert [r.code for r in decision.reasons] == ["ROLE_NOT_AGENT"]


async def test_the_shipped_policy_asks_approval_for_an_irreversible_tool(engine):
    irreversible = replace(CONTRACT, effect_class=EffectClass.IRREVERSIBLE)
    decision = await engine.evaluate(policy_input(contract=irreversible))
    assert decision.outcome == Outcome.REQUIRE_APPROVAL
    assert [r.code for r in decision.reasons] == ["IRREVERSIBLE_TOOL"]


async def test_the_revision_is_the_digest_of_the_policy_files(engine):
    texts = {p.relative_to(POLICY_DIR).as_posix(): p.read_bytes() for p in policy_files(POLICY_DIR)}
    assert texts and await engine.revision() == revision_of(texts)
    assert (await engine.evaluate(policy_input())).revision == revision_of(texts)


def write_policy(folder: Path, body: str) -> Path:
    (folder / "effectledger" / "gate").mkdir(parents=True)
    (folder / "effectledger" / "gate" / "gate.rego").write_text(
        "package effectledger.gate\n\nimport rego.v1\n\n" + body
    )
    return folder


async def test_a_policy_whose_decision_is_undefined_is_policy_undefined(tmp_path):
    engine = EmbeddedRegoEngine(write_policy(tmp_path, 'decision := {"outcome": "ALLOW"} if {\n\tinput.never\n}\n'))
    with pytest.raises(PolicyUnavailable) as caught:
        await engine.evaluate(policy_input())
    assert caught.value.reason == "POLICY_UNDEFINED"


async def test_a_policy_whose_decision_is_no_object_is_policy_undefined(tmp_path):
    engine = EmbeddedRegoEngine(write_policy(tmp_path, 'decision := "ALLOW"\n'))
    with pytest.raises(PolicyUnavailable) as caught:
        await engine.evaluate(policy_input())
    assert caught.value.reason == "POLICY_UNDEFINED"


async def test_a_policy_without_a_decision_rule_is_policy_undefined(tmp_path):
    engine = EmbeddedRegoEngine(write_policy(tmp_path, "other := 1\n"))
    with pytest.raises(PolicyUnavailable) as caught:
        await engine.evaluate(policy_input())
    assert caught.value.reason == "POLICY_UNDEFINED"  # as a remote OPA answers a missing rule


async def test_reload_picks_up_a_changed_policy(tmp_path):
    folder = write_policy(tmp_path, 'decision := {"outcome": "DENY", "reasons": [{"code": "CLOSED"}]}\n')
    engine = EmbeddedRegoEngine(folder)
    before = await engine.revision()
    assert (await engine.evaluate(policy_input())).outcome == Outcome.DENY
    (folder / "effectledger" / "gate" / "gate.rego").write_text(
        'package effectledger.gate\n\nimport rego.v1\n\ndecision := {"outcome": "ALLOW", "reasons": []}\n'
    )
    assert engine.reload() != before
    assert (await engine.evaluate(policy_input())).outcome == Outcome.ALLOW


def test_an_empty_policy_folder_is_refused_at_start(tmp_path):
    with pytest.raises(SystemExit):
        EmbeddedRegoEngine(tmp_path)
