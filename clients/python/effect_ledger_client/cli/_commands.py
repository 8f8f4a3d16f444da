"""The command groups, in the order ``--help`` lists them."""

from effect_ledger_client.cli._app import app
from effect_ledger_client.cli._approvals import approvals
from effect_ledger_client.cli._budgets import budgets
from effect_ledger_client.cli._decisions import decisions
from effect_ledger_client.cli._effects import effects
from effect_ledger_client.cli._principals import principals
from effect_ledger_client.cli._runs import runs
from effect_ledger_client.cli._schedules import schedules
from effect_ledger_client.cli._tools import tools

for name, group in (
    ("effects", effects),
    ("approvals", approvals),
    ("budgets", budgets),
    ("schedules", schedules),
    ("tools", tools),
    ("runs", runs),
    ("decisions", decisions),
    ("principals", principals),
):
    app.add_typer(group, name=name)
