"""``decisions list|show|replay``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from effect_ledger_client.cli._app import (
    LIMIT_DEFAULT,
    PAGE_SIZE_DEFAULT,
    Ctl,
    Limit,
    PageSize,
    command,
    group,
)
from effect_ledger_client.cli._data import message_to_data
from effect_ledger_client.cli._render import DECISION, cell
from effect_ledger_client.cli._values import Outcome, Output
from effect_ledger_client.proto import gate_pb2

decisions = group("Decisions: what the gate answered, under which policy, and what it would answer now.")

# ReplayDecisionResponse.outcome: where the ledger decided, the policy's answer differs by nature.
LEDGER_NOTE = "the ledger's own rules made the recorded decision: a different policy answer is not a change of policy"

DecisionId = Annotated[str, typer.Argument(metavar="DECISION_ID", help="The decision's id.")]


@command(decisions, "list")
def list_decisions(
    ctl: Ctl,
    outcome: Annotated[
        Outcome | None, typer.Option(case_sensitive=False, help="Only decisions with this outcome.")
    ] = None,
    reason: Annotated[
        str | None, typer.Option(help="Only decisions giving this reason code, e.g. TOOL_RETIRED.")
    ] = None,
    run: Annotated[str | None, typer.Option(help="Only decisions of this run.")] = None,
    tool: Annotated[str | None, typer.Option(help="Only decisions about this tool.")] = None,
    limit: Limit = LIMIT_DEFAULT,
    page_size: PageSize = PAGE_SIZE_DEFAULT,
) -> None:
    """The tenant's decisions, oldest first, without their policy input (ListDecisions)."""
    request = gate_pb2.ListDecisionsRequest(
        outcome=outcome.value if outcome else None, reason=reason or "", run_id=run or "", tool=tool or ""
    )
    found = ctl.collect(ctl.ledger.gate.ListDecisions, request, "decisions", limit=limit, page_size=page_size)
    ctl.printer.items(found, DECISION, "decisions")


@command(decisions, "show")
def show_decision(ctl: Ctl, decision_id: DecisionId) -> None:
    """One decision with the policy input it was made from (GetDecision)."""
    ctl.printer.item(ctl.ledger.gate.GetDecision(gate_pb2.GetDecisionRequest(decision_id=decision_id)), DECISION)


@command(decisions, "replay")
def replay_decision(ctl: Ctl, decision_id: DecisionId) -> None:
    """The recorded answer beside what the policy loaded now answers to the same input
    (ReplayDecision; writes nothing)."""
    replay = ctl.ledger.gate.ReplayDecision(gate_pb2.ReplayDecisionRequest(decision_id=decision_id))
    if ctl.output is Output.IDS:
        ctl.printer.ids([replay.recorded.decision_id])
    elif ctl.output is not Output.TABLE:
        ctl.printer.dump(message_to_data(replay))
    else:
        side_by_side(ctl, message_to_data(replay))


def side_by_side(ctl: Ctl, data: dict[str, Any]) -> None:
    recorded = data.get("recorded") or {}

    def codes(holder: dict[str, Any]) -> str:
        return cell([r.get("code", "") for r in holder.get("reasons") or []]) or "-"

    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=f"decision {recorded.get('decision_id', '')}",
        title_justify="left",
        header_style="bold",
        box=None,
        pad_edge=False,
    )
    for title in ("", "RECORDED", "NOW", "CHANGED"):
        table.add_column(title, overflow="fold")
    rows = [
        ("outcome", recorded.get("outcome"), data.get("outcome"), data.get("outcome_changed")),
        ("reasons", codes(recorded), codes(data), bool(data.get("reasons_added") or data.get("reasons_removed"))),
        ("policy revision", recorded.get("policy_revision"), data.get("policy_revision"), data.get("policy_changed")),
        ("engine", recorded.get("engine"), data.get("engine"), None),
    ]
    for name, before, now, changed in rows:
        table.add_row(Text(name, style="bold"), Text(cell(before)), Text(cell(now)), Text(cell(changed)))
    ctl.printer.console.print(table)
    ctl.printer.key_values(
        [
            ("package", data.get("package")),
            ("reasons added", data.get("reasons_added")),
            ("reasons removed", data.get("reasons_removed")),
            ("note", LEDGER_NOTE if recorded.get("engine") == "ledger" else None),
        ]
    )
