"""What the commands print: tables for people (rich), JSON or YAML for programs, identifiers
for the shell. Data goes to standard output; notes and errors go to standard error."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text

from effect_ledger_client.cli._data import message_to_data
from effect_ledger_client.cli._values import Output

# Tables are laid out at least this wide, whatever the terminal (a pipe counts as 80 columns):
# a row stays one line, identifiers whole, and a narrow terminal wraps the long lines, as it
# would those of ps or kubectl, instead of rich squeezing columns into slivers.
TABLE_WIDTH_COLUMNS_MIN = 240
HASH_SHOWN_CHARACTERS = 12
# A column cut to fit shows this much at most (a trace's payloads: -o json has them whole).
TRUNCATED_WIDTH_COLUMNS = 100
# In ``show``, a JSON value longer than this on one line is printed indented, over several.
PRETTY_AFTER_CHARACTERS = 100


def cell(value: Any, *, pretty: bool = False) -> str:
    """A value as table text: lists of names comma-separated, mappings and JSON values as JSON,
    compact unless ``pretty`` and long."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    if isinstance(value, dict | list):
        compact = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        if pretty and len(compact) > PRETTY_AFTER_CHARACTERS:
            return json.dumps(value, ensure_ascii=False, indent=2)
        return compact
    return str(value)


def path(name: str) -> Callable[[Mapping[str, Any]], Any]:
    """A field of the data, or of a message field in it (``receipt.provider_reference``)."""

    def get(data: Mapping[str, Any]) -> Any:
        value: Any = data
        for part in name.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    return get


@dataclass(frozen=True)
class Column:
    title: str
    value: Callable[[Mapping[str, Any]], Any]
    # An identifier: never wrapped, so it can be copied whole.
    identifier: bool = False
    # Cut to the room left (with an ellipsis) rather than wrapped: one line a row.
    truncated: bool = False


def column(title: str, name: str, *, identifier: bool = False, truncated: bool = False) -> Column:
    return Column(title, path(name), identifier, truncated)


@dataclass(frozen=True)
class View:
    """How one kind of message shows: its identifiers, its columns in a list, and the repeated
    fields that ``show`` prints as tables of their own."""

    ids: Callable[[Mapping[str, Any]], list[str]]
    columns: tuple[Column, ...]
    nested: Mapping[str, View] = field(default_factory=dict)


def id_of(name: str) -> Callable[[Mapping[str, Any]], list[str]]:
    def ids(data: Mapping[str, Any]) -> list[str]:
        value = path(name)(data)
        return [str(value)] if value not in (None, "") else []

    return ids


class Printer:
    def __init__(self, output: Output) -> None:
        self.output = output
        detected = Console().width
        self.console = Console(highlight=False, width=max(detected, TABLE_WIDTH_COLUMNS_MIN))

    # --- data -----------------------------------------------------------------------------------

    def dump(self, data: Any) -> None:
        """JSON or YAML of plain data."""
        if self.output is Output.YAML:
            import yaml  # type: ignore[import-untyped]  # (no stubs in the cli extra)

            sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100))
        else:
            sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")

    def ids(self, values: Sequence[str]) -> None:
        for value in values:
            sys.stdout.write(f"{value}\n")

    @staticmethod
    def note(text: str) -> None:
        sys.stderr.write(f"{text}\n")

    # --- messages -------------------------------------------------------------------------------

    def items(self, messages: Sequence[Message], view: View, noun: str) -> None:
        """A list of messages: a table, a JSON array, a YAML list, or identifiers."""
        data = [message_to_data(m) for m in messages]
        if self.output is Output.IDS:
            self.ids([i for d in data for i in view.ids(d)])
        elif self.output is not Output.TABLE:
            self.dump(data)
        elif not data:
            self.note(f"no {noun}")
        else:
            self.console.print(self.table(data, view))

    def item(self, message: Message, view: View) -> None:
        """One message: its fields as rows, then its repeated fields as tables."""
        data = message_to_data(message)
        if self.output is Output.IDS:
            self.ids(view.ids(data))
        elif self.output is not Output.TABLE:
            self.dump(data)
        else:
            rows = [(name, value) for name, value in data.items() if name not in view.nested]
            self.key_values(rows)
            for name, nested in view.nested.items():
                if data.get(name):
                    self.console.print(self.table(data[name], nested, title=name))

    def key_values(self, rows: Sequence[tuple[str, Any]], title: str | None = None) -> None:
        table = Table(title=title, show_header=False, title_justify="left", box=None, pad_edge=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for name, value in rows:
            if value not in (None, "", [], {}):
                table.add_row(Text(name), Text(cell(value, pretty=True)))
        self.console.print(table)

    def table(self, rows: Sequence[Mapping[str, Any]], view: View, title: str | None = None) -> Table:
        table = Table(title=title, title_justify="left", header_style="bold", box=None, pad_edge=False)
        for each in view.columns:
            table.add_column(
                each.title,
                no_wrap=each.identifier or each.truncated,
                overflow="ellipsis" if each.truncated else "fold",
                max_width=TRUNCATED_WIDTH_COLUMNS if each.truncated else None,
            )
        for row in rows:
            table.add_row(*(Text(cell(each.value(row))) for each in view.columns))
        return table

    def event(self, message: Message, view: View) -> None:
        """One event of a stream, on one line (JSON Lines with ``-o json``), flushed at once."""
        data = message_to_data(message)
        if self.output is Output.IDS:
            self.ids(view.ids(data))
        elif self.output is Output.JSON:
            sys.stdout.write(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n")
        elif self.output is Output.YAML:
            sys.stdout.write("---\n")
            self.dump(data)
        else:
            sys.stdout.write("  ".join(cell(each.value(data)) or "-" for each in view.columns) + "\n")
        sys.stdout.flush()


# --- the views --------------------------------------------------------------------------------


def _count(name: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda data: len(data.get(name) or [])


def _short_hash(data: Mapping[str, Any]) -> str:
    return str(data.get("hash", ""))[:HASH_SHOWN_CHARACTERS]


def _reason_codes(data: Mapping[str, Any]) -> list[str]:
    return [r.get("code", "") for r in data.get("reasons") or []]


def _labels(data: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in (data.get("labels") or {}).items())


def _votes(data: Mapping[str, Any]) -> str:
    approving = sum(1 for v in data.get("votes") or [] if v.get("approve"))
    return f"{approving}/{data.get('quorum', 0)}"


def _amounts(name: str) -> Callable[[Mapping[str, Any]], str]:
    """A map of amounts, ``usd_micros=1500, tool_calls=1``."""
    return lambda data: ", ".join(f"{k}={v}" for k, v in (data.get(name) or {}).items())


def _enabled(data: Mapping[str, Any]) -> str:
    return f"disabled {data['disabled_at']}" if data.get("disabled_at") else "enabled"


ATTEMPT = View(
    id_of("attempt_id"),
    (
        column("#", "number"),
        column("ATTEMPT", "attempt_id", identifier=True),
        column("STAGE", "stage"),
        column("PROVIDER KEY", "provider_idempotency_key", identifier=True),
        column("DECISION", "decision_id", identifier=True),
        column("REASON", "outcome_reason"),
        column("RECEIPT", "receipt.provider_reference"),
        column("FINISHED", "finished_at"),
    ),
)

EFFECT = View(
    id_of("effect_id"),
    (
        column("EFFECT", "effect_id", identifier=True),
        column("STAGE", "stage"),
        column("TOOL", "tool"),
        column("RUN", "run_id", identifier=True),
        column("TARGET", "target"),
        Column("ATTEMPTS", _count("attempts")),
        column("UPDATED", "updated_at"),
    ),
    {"attempts": ATTEMPT},
)

VOTE = View(
    id_of("reviewer_id"),
    (
        column("REVIEWER", "reviewer_id", identifier=True),
        column("APPROVE", "approve"),
        column("COMMENT", "comment"),
        column("AT", "created_at"),
    ),
)

APPROVAL = View(
    id_of("approval_id"),
    (
        column("APPROVAL", "approval_id", identifier=True),
        column("STATE", "state"),
        column("TOOL", "tool"),
        column("RUN", "run_id", identifier=True),
        column("TARGET", "target"),
        column("REQUESTED BY", "requested_by"),
        Column("VOTES", _votes),
        column("EXPIRES", "expires_at"),
    ),
    {"votes": VOTE},
)

APPROVAL_EVENT = View(
    id_of("approval.approval_id"),
    (
        column("SEQUENCE", "sequence"),
        column("TYPE", "type"),
        column("APPROVAL", "approval.approval_id", identifier=True),
        column("STATE", "approval.state"),
        column("TOOL", "approval.tool"),
        column("RUN", "approval.run_id", identifier=True),
        column("BY", "principal_id"),
        column("AT", "created_at"),
    ),
)

BUDGET = View(
    id_of("budget_id"),
    (
        column("BUDGET", "budget_id", identifier=True),
        column("SCOPE", "scope"),
        column("SCOPE ID", "scope_id", identifier=True),
        column("DIMENSION", "dimension"),
        column("LIMIT", "limit"),
        column("POSTED", "posted"),
        column("PENDING", "pending"),
        column("AVAILABLE", "available"),
        column("EXHAUSTED", "exhausted"),
    ),
)

RESERVATION = View(
    id_of("reservation_id"),
    (
        column("RESERVATION", "reservation_id", identifier=True),
        column("BUDGET", "budget_id", identifier=True),
        column("DIMENSION", "dimension"),
        column("AMOUNT", "amount"),
        column("STATE", "state"),
        column("EFFECT", "effect_id", identifier=True),
        column("CREATED", "created_at"),
    ),
)

BUDGETS_OF_SCOPE = View(
    lambda data: [b["budget_id"] for b in data.get("budgets") or []],
    (),
    {"budgets": BUDGET, "open_reservations": RESERVATION},
)

TOOL = View(
    id_of("tool"),
    (
        column("TOOL", "tool", identifier=True),
        column("REVISION", "revision"),
        column("EFFECT CLASS", "effect_class"),
        column("RECOVERY", "allowed_recovery"),
        column("MAX ATTEMPTS", "max_attempts"),
        column("LEASE S", "lease_seconds"),
        column("RETIRED", "retired"),
    ),
)

RUN = View(
    id_of("run_id"),
    (
        column("RUN", "run_id", identifier=True),
        column("CREATED BY", "created_by"),
        column("CREATED", "created_at"),
        column("REVISION", "revision"),
        column("WORLD", "world"),
        Column("LABELS", _labels),
        column("PARENT", "parent_run_id", identifier=True),
    ),
)

RUN_EVENT = View(
    id_of("revision"),
    (
        column("REVISION", "revision"),
        column("TYPE", "type"),
        column("BY", "principal_id"),
        column("AT", "created_at"),
        Column("HASH", _short_hash),
        column("PAYLOAD", "payload_json", truncated=True),
    ),
)

REASON = View(id_of("code"), (column("CODE", "code"), column("MESSAGE", "message")))

DECISION = View(
    id_of("decision_id"),
    (
        column("DECISION", "decision_id", identifier=True),
        column("OUTCOME", "outcome"),
        Column("REASONS", _reason_codes),
        column("TOOL", "tool"),
        column("RUN", "run_id", identifier=True),
        column("EFFECT", "effect_id", identifier=True),
        column("ENGINE", "engine"),
        column("CREATED", "created_at"),
    ),
    {"reasons": REASON},
)

PRINCIPAL = View(
    id_of("principal_id"),
    (
        column("PRINCIPAL", "principal_id", identifier=True),
        column("ROLES", "roles"),
        Column("STATUS", _enabled),
        column("TOKEN ISSUED", "token_issued_at"),
        column("TOKEN EXPIRES", "token_expires_at"),
        column("CLIENT SUBJECT", "client_subject"),
    ),
)

SCHEDULE = View(
    id_of("schedule_id"),
    (
        column("SCHEDULE", "schedule_id", identifier=True),
        column("RUN", "run_id", identifier=True),
        column("KEY", "idempotency_key", identifier=True),
        column("TOOL", "tool"),
        column("PURPOSE", "purpose"),
        column("STATE", "state"),
        column("NOT BEFORE", "not_before"),
        column("DEADLINE", "deadline"),
        Column("RESERVATION", _amounts("reservation")),
    ),
)

DUE_INTENT = View(
    id_of("schedule.schedule_id"),
    (
        column("SEQUENCE", "sequence"),
        column("SCHEDULE", "schedule.schedule_id", identifier=True),
        column("RUN", "schedule.run_id", identifier=True),
        column("KEY", "schedule.idempotency_key", identifier=True),
        column("TOOL", "schedule.tool"),
        column("PURPOSE", "schedule.purpose"),
        column("STATE", "schedule.state"),
        column("NOT BEFORE", "schedule.not_before"),
        column("DUE AT", "schedule.due_at"),
        column("FIRED BY", "schedule.fired_by"),
    ),
)
