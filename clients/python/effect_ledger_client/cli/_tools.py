"""``tools put|list|show|retire``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
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
from effect_ledger_client.cli._data import data_to_message, read_document
from effect_ledger_client.cli._render import TOOL
from effect_ledger_client.proto import tools_pb2

tools = group("Tool contracts: what each tool's effects are, and how they may be recovered.")

ToolName = Annotated[str, typer.Argument(metavar="TOOL", help="The tool's name, e.g. email.send.")]


def put_request(document: Any, source: str, expected_revision: int | None) -> tools_pb2.PutToolContractRequest:
    """A PutToolContractRequest from a document holding one (``contract:`` at the top) or just
    a ToolContract; --expected-revision wins over the document's."""
    if isinstance(document, Mapping) and "contract" in document:
        request = data_to_message(document, tools_pb2.PutToolContractRequest, source)
    else:
        request = tools_pb2.PutToolContractRequest(contract=data_to_message(document, tools_pb2.ToolContract, source))
    if expected_revision is not None:
        request.expected_revision = expected_revision
    return request


@command(tools, "put")
def put_tool(
    ctl: Ctl,
    file: Annotated[
        Path,
        typer.Option(
            "--file",
            "-f",
            dir_okay=False,
            help="The contract, YAML or JSON, with the fields of ToolContract (or of PutToolContractRequest); "
            "arguments_schema_json as a mapping. -: standard input.",
        ),
    ],
    expected_revision: Annotated[
        int | None,
        typer.Option(min=0, help="Refused unless the tool's current revision is this one (0: the tool must be new)."),
    ] = None,
) -> None:
    """Register a tool's contract, or a new revision of it (PutToolContract; admins). The same
    contract again changes nothing."""
    request = put_request(read_document(file), str(file), expected_revision)
    ctl.printer.item(ctl.ledger.tools.PutToolContract(request), TOOL)


@command(tools, "list")
def list_tools(
    ctl: Ctl,
    include_retired: Annotated[bool, typer.Option("--include-retired", help="Retired tools too.")] = False,
    limit: Limit = LIMIT_DEFAULT,
    page_size: PageSize = PAGE_SIZE_DEFAULT,
) -> None:
    """The latest revision of each tool, by name (ListToolContracts)."""
    request = tools_pb2.ListToolContractsRequest(include_retired=include_retired)
    found = ctl.collect(ctl.ledger.tools.ListToolContracts, request, "contracts", limit=limit, page_size=page_size)
    ctl.printer.items(found, TOOL, "tools")


@command(tools, "show")
def show_tool(
    ctl: Ctl,
    tool: ToolName,
    revision: Annotated[int, typer.Option(min=0, help="This revision (0: the latest).")] = 0,
) -> None:
    """One tool's contract (GetToolContract)."""
    request = tools_pb2.GetToolContractRequest(tool=tool, revision=revision)
    ctl.printer.item(ctl.ledger.tools.GetToolContract(request), TOOL)


@command(tools, "retire")
def retire_tool(
    ctl: Ctl,
    tool: ToolName,
    reason: Annotated[str | None, typer.Option(help="Why, kept with the retired revision.")] = None,
) -> None:
    """Retire a tool (RetireTool; admins): it stays in history and is never authorized again."""
    request = tools_pb2.RetireToolRequest(tool=tool, reason=reason or "")
    ctl.printer.item(ctl.ledger.tools.RetireTool(request), TOOL)
