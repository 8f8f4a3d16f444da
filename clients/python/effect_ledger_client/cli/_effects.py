"""``effects list|show|reconcile``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from effect_ledger_client.cli._app import (
    LIMIT_DEFAULT,
    PAGE_SIZE_DEFAULT,
    Ctl,
    Limit,
    PageSize,
    Since,
    Until,
    command,
    group,
)
from effect_ledger_client.cli._data import data_to_message, parse_document, read_document
from effect_ledger_client.cli._render import EFFECT
from effect_ledger_client.cli._values import BadValue, Stage, created_range
from effect_ledger_client.proto import common_pb2, gate_pb2

effects = group("Effects: what agents did or set out to do, and settling the uncertain ones.")

EffectId = Annotated[str, typer.Argument(metavar="EFFECT_ID", help="The effect's id.")]


@command(effects, "list")
def list_effects(
    ctl: Ctl,
    stage: Annotated[
        list[Stage] | None,
        typer.Option(
            case_sensitive=False, show_default=False, help="Only effects at this stage; repeat it for any of several."
        ),
    ] = None,
    tool: Annotated[str | None, typer.Option(help="Only effects of this tool.")] = None,
    run: Annotated[str | None, typer.Option(help="Only effects of this run.")] = None,
    target: Annotated[str | None, typer.Option(help="Only effects on this target (exact).")] = None,
    since: Since = None,
    until: Until = None,
    limit: Limit = LIMIT_DEFAULT,
    page_size: PageSize = PAGE_SIZE_DEFAULT,
) -> None:
    """The tenant's effects of every run, oldest first (ListEffects). A lease that ran out
    counts as UNKNOWN."""
    request = gate_pb2.ListEffectsRequest(
        stages=[s.value for s in stage or []], tool=tool or "", run_id=run or "", target=target or ""
    )
    created_range(request, since, until)
    found = ctl.collect(ctl.ledger.gate.ListEffects, request, "effects", limit=limit, page_size=page_size)
    ctl.printer.items(found, EFFECT, "effects")


@command(effects, "show")
def show_effect(ctl: Ctl, effect_id: EffectId) -> None:
    """One effect with its attempts and receipt (GetEffect)."""
    ctl.printer.item(ctl.ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=effect_id)), EFFECT)


@command(effects, "reconcile")
def reconcile_effect(
    ctl: Ctl,
    effect_id: EffectId,
    receipt_json: Annotated[
        str | None,
        typer.Option(
            help="It happened: the receipt, JSON or YAML with the fields of Receipt, e.g. "
            '\'{"provider_reference": "msg-8841", "detail_json": {"status": "sent"}}\'.'
        ),
    ] = None,
    receipt_file: Annotated[
        Path | None,
        typer.Option(dir_okay=False, help="It happened: the receipt from a JSON or YAML file (-: standard input)."),
    ] = None,
    not_happened: Annotated[
        bool,
        typer.Option("--not-happened", help="It did not happen: the provider has no record of it. Needs --reason."),
    ] = False,
    reason: Annotated[
        str | None, typer.Option(help="With --not-happened: what the provider said, and how it was asked.")
    ] = None,
    lookup_reference: Annotated[
        str | None,
        typer.Option(
            help="With --not-happened: the reference the provider lookup was made under (its idempotency key, a query id)."
        ),
    ] = None,
    lookup_result_json: Annotated[
        str | None, typer.Option(help="With --not-happened: the provider lookup's answer, a JSON object.")
    ] = None,
) -> None:
    """Settle an effect whose outcome is open or unknown, with evidence (ReconcileEffect):
    a receipt, or --not-happened with a reason."""
    request = reconcile_request(
        effect_id, receipt_json, receipt_file, not_happened, reason, lookup_reference, lookup_result_json
    )
    ctl.printer.item(ctl.ledger.gate.ReconcileEffect(request), EFFECT)


def reconcile_request(
    effect_id: str,
    receipt_json: str | None,
    receipt_file: Path | None,
    not_happened: bool,
    reason: str | None,
    lookup_reference: str | None,
    lookup_result_json: str | None,
) -> gate_pb2.ReconcileEffectRequest:
    given = [receipt_json is not None, receipt_file is not None, not_happened]
    if sum(given) != 1:
        raise BadValue("give one kind of evidence: --receipt-json, --receipt-file or --not-happened")
    if not not_happened:
        if reason is not None or lookup_reference is not None or lookup_result_json is not None:
            raise BadValue("--reason and --lookup-* go with --not-happened (a receipt is its own evidence)")
        document = (
            parse_document(receipt_json, "--receipt-json") if receipt_json is not None else read_document(receipt_file)  # type: ignore[arg-type]
        )
        receipt = data_to_message(document, common_pb2.Receipt, "receipt")
        return gate_pb2.ReconcileEffectRequest(effect_id=effect_id, receipt=receipt)
    if not reason:
        raise BadValue("--not-happened needs --reason: what the provider said, and how it was asked")
    evidence = data_to_message(
        {
            "reason": reason,
            "lookup_reference": lookup_reference or "",
            "lookup_result_json": (
                parse_document(lookup_result_json, "--lookup-result-json") if lookup_result_json else None
            ),
        },
        gate_pb2.ReconcileEffectRequest.NotHappened,
        "--not-happened",
    )
    return gate_pb2.ReconcileEffectRequest(effect_id=effect_id, not_happened=evidence)
