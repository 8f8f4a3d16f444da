"""``budgets list|show|put``."""

from __future__ import annotations

from typing import Annotated

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
from effect_ledger_client.cli._render import BUDGET, BUDGETS_OF_SCOPE
from effect_ledger_client.cli._values import BadValue, BudgetScope
from effect_ledger_client.proto import budgets_pb2

budgets = group("Budgets: limits that the gate reserves against before every effect.")

Scope = Annotated[BudgetScope, typer.Argument(metavar="SCOPE", case_sensitive=False, help="TENANT, RUN or RUN_TREE.")]
ScopeId = Annotated[
    str | None, typer.Argument(metavar="RUN_ID", help="The run, for RUN and RUN_TREE.", show_default=False)
]


def scope_id_of(scope: BudgetScope, scope_id: str | None) -> str:
    if scope is BudgetScope.TENANT and scope_id:
        raise BadValue("a TENANT budget names no run")
    if scope is not BudgetScope.TENANT and not scope_id:
        raise BadValue(f"a {scope.value} budget names its run: {scope.value} RUN_ID")
    return scope_id or ""


@command(budgets, "list")
def list_budgets(
    ctl: Ctl,
    scope: Annotated[BudgetScope | None, typer.Option(case_sensitive=False, help="Only budgets of this scope.")] = None,
    run: Annotated[str | None, typer.Option(help="Only the budgets of this run (scopes RUN and RUN_TREE).")] = None,
    dimension: Annotated[
        str | None, typer.Option(help="Only budgets of this dimension (usd_micros, tool_calls, ...).")
    ] = None,
    exhausted: Annotated[bool, typer.Option("--exhausted", help="Only budgets with nothing available.")] = False,
    limit: Limit = LIMIT_DEFAULT,
    page_size: PageSize = PAGE_SIZE_DEFAULT,
) -> None:
    """The tenant's budgets of every scope (ListBudgets)."""
    request = budgets_pb2.ListBudgetsRequest(
        scope=scope.value if scope else None,
        scope_id=run or "",
        dimension=dimension or "",
        exhausted_only=exhausted,
    )
    found = ctl.collect(ctl.ledger.budgets.ListBudgets, request, "budgets", limit=limit, page_size=page_size)
    ctl.printer.items(found, BUDGET, "budgets")


@command(budgets, "show")
def show_budgets(ctl: Ctl, scope: Scope, scope_id: ScopeId = None) -> None:
    """Every dimension of one scope, with its open reservations (GetBudget)."""
    request = budgets_pb2.GetBudgetRequest(scope=scope.value, scope_id=scope_id_of(scope, scope_id))
    ctl.printer.item(ctl.ledger.budgets.GetBudget(request), BUDGETS_OF_SCOPE)


@command(budgets, "put")
def put_budget(
    ctl: Ctl,
    scope: Scope,
    dimension: Annotated[
        str, typer.Option(help="usd_micros, tokens_in, tokens_out, tool_calls, or a name of your own.")
    ],
    limit: Annotated[int, typer.Option("--limit", min=0, help="The budget's limit, in the dimension's unit.")],
    scope_id: ScopeId = None,
    reset_period_seconds: Annotated[
        int, typer.Option(min=0, help="0: never resets; else posted restarts at 0 every period.")
    ] = 0,
) -> None:
    """Create or change the budget of a scope and dimension (PutBudget; admins)."""
    request = budgets_pb2.PutBudgetRequest(
        scope=scope.value,
        scope_id=scope_id_of(scope, scope_id),
        dimension=dimension,
        limit=limit,
        reset_period_seconds=reset_period_seconds,
    )
    ctl.printer.item(ctl.ledger.budgets.PutBudget(request), BUDGET)
