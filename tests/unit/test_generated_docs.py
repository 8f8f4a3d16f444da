"""docs/errors.md and docs/api.md are what effect_ledger.tools.gendocs makes from the code now."""

from __future__ import annotations

import difflib

import pytest

from effect_ledger import reasons
from effect_ledger.tools.gendocs import (
    API_DOC,
    ERRORS_DOC,
    api_markdown,
    errors_markdown,
    roles_text,
    status_of,
)
from effect_ledger.transport import roles

REGENERATE = "regenerate: PYTHONPATH=server .venv/bin/python -m effect_ledger.tools.gendocs"


def _difference(committed: str, generated: str) -> str:
    lines = difflib.unified_diff(
        committed.splitlines(), generated.splitlines(), "committed", "generated", lineterm="", n=1
    )
    return "\n".join(list(lines)[:40])


@pytest.fixture(scope="module")
def api() -> str:
    return api_markdown()


@pytest.fixture(scope="module")
def error_doc() -> str:
    return errors_markdown()


def test_docs_errors_md_is_current(error_doc):
    committed = ERRORS_DOC.read_text()
    assert committed == error_doc, f"{REGENERATE}\n{_difference(committed, error_doc)}"


def test_docs_api_md_is_current(api):
    committed = API_DOC.read_text()
    assert committed == api, f"{REGENERATE}\n{_difference(committed, api)}"


def test_the_error_doc_lists_every_reason_under_its_status(error_doc):
    for reason in reasons.ERROR_REASONS:
        section = error_doc.split(f"\n### {status_of(reason.error).code}\n", 1)[1].split("\n#", 1)[0]
        assert f"| `{reason.code}` |" in section, reason.code
    decisions = error_doc.split("\n## Decision reasons\n", 1)[1]
    for decision in reasons.DECISION_REASONS:
        assert f"| `{decision.code}` | {decision.outcome.value} |" in decisions, decision.code


def test_status_of_follows_the_error_table():
    from effect_ledger import errors

    assert status_of(errors.PolicyUnavailable).code == "UNAVAILABLE"
    assert "RetryInfo" in status_of(errors.PolicyUnavailable).details
    assert status_of(errors.InvalidArgument).details == ("ErrorInfo", "BadRequest")
    assert status_of(None).code == "INTERNAL"


def test_the_api_doc_shows_each_rpc_with_its_roles(api):
    for name, entry in roles.RPC_ROLES.items():
        service, method = name.removeprefix(f"{roles.PACKAGE}.").split("/")
        section = api.split(f"\n### {service}.{method}\n", 1)[1].split("\n### ", 1)[0]
        assert f"**Roles:** {roles_text(entry.roles)}." in section, name
        assert entry.note in section, name


def test_the_api_doc_carries_the_proto_comments(api):
    # A comment on an RPC, on a field and on an enum value, from the .proto source.
    assert "Evaluates a recorded decision's stored policy input again under the policy loaded now" in api
    assert "Scoped to the tenant: the same key names the same intended effect." in api
    assert "A run and every run forked from it." in api
