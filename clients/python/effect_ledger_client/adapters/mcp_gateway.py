"""An MCP gateway: an MCP server that fronts another MCP server (over stdio) and asks the ledger
before forwarding each ``tools/call``.

    python -m effect_ledger_client.adapters.mcp_gateway --config gateway.toml
    python -m effect_ledger_client.adapters.mcp_gateway --config gateway.toml --register-contracts

The gateway lists the upstream's configured tools as its own. A call of a gated tool runs under
the client's guard (``AsyncLedger.guard``):

    gate's answer          what the MCP client gets                         the upstream
    ALLOW                  the upstream's result                            called once
    DENY                   a tool error naming the reasons                  not called
    REQUIRE_APPROVAL       a tool error naming the approval request         not called
    DUPLICATE              the stored result (the receipt's detail)         not called
    RECONCILE_REQUIRED     a tool error naming the effect and its stage     not called
    (the ledger fails)     a tool error naming the reason                   not called

After an ALLOW: an upstream result with ``isError`` true is recorded UNKNOWN (an MCP tool error
does not say whether the tool acted first), or FAILED for a tool configured
``error_outcome = "failed"`` (its errors are definite rejections); a transport failure, timeout
or protocol error UNKNOWN (it may have happened); anything else SUCCEEDED with a receipt whose detail holds the upstream's result (cut down to an excerpt
and its SHA-256 when it would not fit the ledger's 64 KiB). Tools the configuration does not
name are neither listed nor forwarded. Every answer of the gateway's own carries ``_meta`` keys
under ``effect-ledger/`` (outcome, effect_id, approval_request_id, ...) for programs; the text
is for the model. The configuration format is in examples/mcp_gateway/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from google.protobuf import json_format
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from effect_ledger_client import (
    AlreadySucceeded,
    ApprovalDenied,
    ApprovalTimeout,
    AsyncLedger,
    Denied,
    LedgerError,
    ReconcileRequired,
    Rejected,
)
from effect_ledger_client.outcomes import Reason, Receipt
from effect_ledger_client.proto import runs_pb2, tools_pb2

log = logging.getLogger("effect_ledger_client.mcp_gateway")

META_PREFIX = "effect-ledger/"
# What the ledger accepts as receipt detail (docs/decisions.md, "JSON"): 64 KiB, depth 32.
# The gateway's own JSON and the ledger's canonical form differ by a few bytes (number
# formats, escapes), so it keeps a margin below each limit.
RECEIPT_DETAIL_SIZE_MAX_BYTES = 64 * 1024 - 1024
RECEIPT_DETAIL_DEPTH_MAX = 30
# The first cut of an oversized result's excerpt; halved until it fits.
EXCERPT_CHARACTERS_FIRST = 32 * 1024
# Integers the ledger accepts: those an IEEE double holds exactly.
DOUBLE_INTEGER_EXACT_MAX = 2**53
CONFIG_SIZE_MAX_BYTES = 1024 * 1024
# The upstream's error text kept as the reason of a FAILED outcome.
REASON_CHARACTERS_MAX = 1000
UPSTREAM_CALL_TIMEOUT_SECONDS_DEFAULT = 60.0
LEDGER_TIMEOUT_SECONDS_DEFAULT = 10.0
RUN_ADAPTER = "effect-ledger-mcp-gateway"
TOOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")
TEMPLATE_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
PYTHON_PLACEHOLDER = "{python}"


# --- configuration ------------------------------------------------------------------------------


class ConfigError(ValueError):
    """The configuration file is unusable; the message names the field."""


@dataclass(frozen=True)
class ToolRule:
    """How one upstream tool is gated."""

    name: str
    gated: bool = True
    ledger_tool: str = ""
    # Argument names the idempotency key is derived from; None: all arguments.
    key_arguments: tuple[str, ...] | None = None
    # "run": the same arguments in another run are another effect; "tenant": the same effect.
    key_scope: str = "run"
    # A template over the arguments, e.g. "mailto:{to}"; "" lets the guard use the tool name.
    target: str = ""
    # What an upstream result with isError true is recorded as. "unknown" unless the config says
    # "failed": an MCP tool error does not say whether the tool acted before it failed, so only a
    # tool whose errors are known to be definite rejections may have them recorded FAILED.
    error_outcome: str = "unknown"


@dataclass(frozen=True)
class GatewayConfig:
    ledger_target: str
    token_env: str
    admin_token_env: str = ""
    root_certificates: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    ledger_timeout_seconds: float = LEDGER_TIMEOUT_SECONDS_DEFAULT
    run_id: str = ""
    run_request_id: str = ""
    run_labels: dict[str, str] = field(default_factory=dict)
    upstream_command: tuple[str, ...] = ()
    upstream_env: dict[str, str] = field(default_factory=dict)
    upstream_cwd: str | None = None
    upstream_call_timeout_seconds: float = UPSTREAM_CALL_TIMEOUT_SECONDS_DEFAULT
    approval_wait_seconds: float = 0.0
    tools: dict[str, ToolRule] = field(default_factory=dict)
    contracts: dict[str, dict[str, Any]] = field(default_factory=dict)


def load_config(path: str | os.PathLike) -> GatewayConfig:
    """Read a TOML (``.toml``) or JSON configuration; relative paths in it are relative to its
    folder. Raises ConfigError naming the first bad field."""
    file = Path(path)
    data = file.read_bytes()
    if len(data) > CONFIG_SIZE_MAX_BYTES:
        raise ConfigError(f"{file}: larger than {CONFIG_SIZE_MAX_BYTES} bytes")
    try:
        raw = json.loads(data) if file.suffix == ".json" else tomllib.loads(data.decode())
    except (ValueError, UnicodeDecodeError) as error:
        raise ConfigError(f"{file}: {error}") from None
    return parse_config(raw, file.resolve().parent)


def parse_config(raw: Mapping[str, Any], folder: Path) -> GatewayConfig:
    ledger = _table(raw, "ledger")
    run = _table(raw, "run", required=False)
    upstream = _table(raw, "upstream")
    gateway = _table(raw, "gateway", required=False)
    contracts = _table(raw, "contracts", required=False)
    run_id, request_id = _run_identity(run)
    return GatewayConfig(
        ledger_target=_text(ledger, "ledger.target"),
        token_env=_text(ledger, "ledger.token_env"),
        admin_token_env=_text(ledger, "ledger.admin_token_env", ""),
        root_certificates=_path(ledger, "ledger.root_certificates", folder),
        client_certificate=_path(ledger, "ledger.client_certificate", folder),
        client_key=_path(ledger, "ledger.client_key", folder),
        ledger_timeout_seconds=_seconds(ledger, "ledger.timeout_seconds", LEDGER_TIMEOUT_SECONDS_DEFAULT),
        run_id=run_id,
        run_request_id=request_id,
        run_labels=_strings(run, "run.labels"),
        upstream_command=_command(upstream),
        upstream_env=_strings(upstream, "upstream.env"),
        upstream_cwd=_path(upstream, "upstream.cwd", folder) or str(folder),
        upstream_call_timeout_seconds=_seconds(
            upstream, "upstream.call_timeout_seconds", UPSTREAM_CALL_TIMEOUT_SECONDS_DEFAULT
        ),
        approval_wait_seconds=_seconds(gateway, "gateway.approval_wait_seconds", 0.0, zero=True),
        tools={name: _tool_rule(name, rule) for name, rule in _table(raw, "tools").items()},
        contracts={name: dict(_table(contracts, name, prefix="contracts.")) for name in contracts},
    )


def _run_identity(run: Mapping[str, Any]) -> tuple[str, str]:
    """(run id, CreateRun request id): exactly one of ``id``, ``request_id``, ``request_id_env``."""
    given = [name for name in ("id", "request_id", "request_id_env") if name in run]
    if len(given) != 1:
        raise ConfigError("run: give exactly one of id, request_id, request_id_env")
    if "id" in run:
        return _text(run, "run.id"), ""
    if "request_id" in run:
        return "", _text(run, "run.request_id")
    variable = _text(run, "run.request_id_env")
    value = os.environ.get(variable, "")
    if not value:
        raise ConfigError(f"run.request_id_env: the environment variable {variable} is not set")
    return "", value


def _tool_rule(name: str, rule: Any) -> ToolRule:
    where = f"tools.{name}"
    if not isinstance(rule, Mapping):
        raise ConfigError(f"{where}: a table")
    unknown = set(rule) - {"gated", "ledger_tool", "key", "key_scope", "target", "error_outcome"}
    if unknown:
        raise ConfigError(f"{where}: unknown setting {min(unknown)}")
    gated = rule.get("gated", True)
    if not isinstance(gated, bool):
        raise ConfigError(f"{where}.gated: true or false")
    ledger_tool = _text(rule, f"{where}.ledger_tool", name)
    if gated and not TOOL_NAME.fullmatch(ledger_tool):
        raise ConfigError(f"{where}.ledger_tool: {ledger_tool!r} is not a ledger tool name; set one")
    key = rule.get("key")
    if key is not None and not (isinstance(key, list) and key and all(isinstance(item, str) for item in key)):
        raise ConfigError(f"{where}.key: a non-empty list of argument names")
    return ToolRule(
        name=name,
        gated=gated,
        ledger_tool=ledger_tool,
        key_arguments=tuple(key) if key is not None else None,
        key_scope=_choice(rule, f"{where}.key_scope", ("run", "tenant")),
        target=_text(rule, f"{where}.target", ""),
        error_outcome=_choice(rule, f"{where}.error_outcome", ("unknown", "failed")),
    )


def _table(raw: Mapping[str, Any], name: str, *, required: bool = True, prefix: str = "") -> Mapping[str, Any]:
    value = raw.get(name)
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{prefix}{name}: a table is required")
    return value


def _text(table: Mapping[str, Any], where: str, default: str | None = None) -> str:
    value = table.get(where.rsplit(".", 1)[-1], default)
    if not isinstance(value, str) or (default is None and not value):
        raise ConfigError(f"{where}: a non-empty string is required")
    return value


def _choice(table: Mapping[str, Any], where: str, choices: tuple[str, ...]) -> str:
    value = _text(table, where, choices[0])
    if value not in choices:
        raise ConfigError(f"{where}: one of {', '.join(choices)}")
    return value


def _seconds(table: Mapping[str, Any], where: str, default: float, *, zero: bool = False) -> float:
    value = table.get(where.rsplit(".", 1)[-1], default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (value == 0 and not zero):
        raise ConfigError(f"{where}: a {'non-negative' if zero else 'positive'} number of seconds")
    return float(value)


def _path(table: Mapping[str, Any], where: str, folder: Path) -> str | None:
    if where.rsplit(".", 1)[-1] not in table:
        return None
    return str(folder / _text(table, where))


def _strings(table: Mapping[str, Any], where: str) -> dict[str, str]:
    value = table.get(where.rsplit(".", 1)[-1], {})
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{where}: a table of strings")
    return dict(value)


def _command(upstream: Mapping[str, Any]) -> tuple[str, ...]:
    command = upstream.get("command")
    if not (isinstance(command, list) and command and all(isinstance(item, str) and item for item in command)):
        raise ConfigError("upstream.command: a non-empty list of strings (argv)")
    # "{python}" names the interpreter the gateway runs on, so an example runs from any venv.
    return tuple(sys.executable if item == PYTHON_PLACEHOLDER else item for item in command)


# --- keys, targets and receipts -----------------------------------------------------------------


class Refusal(Exception):
    """The gateway refuses a call before asking the ledger; the upstream is not called."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def idempotency_key(rule: ToolRule, run_id: str, arguments: Mapping[str, Any]) -> str:
    """``mcp/<ledger tool>/<sha256>`` over the scope and the key's arguments: the same
    arguments (of the named ones) in the same scope name the same effect. At most 197
    printable ASCII characters, as the ledger's identifiers must be."""
    if rule.key_arguments is None:
        chosen = dict(arguments)
    else:
        missing = [name for name in rule.key_arguments if name not in arguments]
        if missing:
            raise Refusal(
                "KEY_ARGUMENT_MISSING",
                f"the idempotency key of {rule.name} needs argument {missing[0]!r}",
            )
        chosen = {name: arguments[name] for name in rule.key_arguments}
    scope = {"run": run_id} if rule.key_scope == "run" else {"tenant": True}
    digest = hashlib.sha256(canonical_json({"scope": scope, "arguments": chosen}).encode()).hexdigest()
    return f"mcp/{rule.ledger_tool}/{digest}"


def render_target(template: str, arguments: Mapping[str, Any]) -> str | None:
    """``{name}`` replaced by the argument (strings as they are, other values as JSON); only
    plain names, so a template cannot reach attributes the way ``str.format`` would."""
    if not template:
        return None

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name not in arguments:
            raise Refusal("TARGET_ARGUMENT_MISSING", f"the target template needs argument {name!r}")
        argument = arguments[name]
        return argument if isinstance(argument, str) else canonical_json(argument)

    return TEMPLATE_FIELD.sub(value, template)


def receipt_detail(result: types.CallToolResult) -> dict[str, Any]:
    """The upstream's result as receipt detail: whole when the ledger can hold it, else an
    excerpt of its JSON with the whole's SHA-256 and size."""
    dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    detail = {"mcp_result": dumped}
    encoded = canonical_json(detail).encode()
    if len(encoded) <= RECEIPT_DETAIL_SIZE_MAX_BYTES and _fits_ledger_json(detail, 1):
        return detail
    whole = canonical_json(dumped)
    characters = EXCERPT_CHARACTERS_FIRST
    while True:
        excerpt = {
            "mcp_result_excerpt": whole[:characters],
            "mcp_result_sha256": hashlib.sha256(whole.encode()).hexdigest(),
            "mcp_result_size_bytes": len(whole.encode()),
            "truncated": True,
        }
        if len(canonical_json(excerpt).encode()) <= RECEIPT_DETAIL_SIZE_MAX_BYTES:
            return excerpt
        characters //= 2


def _fits_ledger_json(value: Any, depth: int) -> bool:
    """Within the ledger's nesting depth, with numbers it takes (a double holds them exactly)."""
    if depth > RECEIPT_DETAIL_DEPTH_MAX:
        return False
    if isinstance(value, dict):
        return all(_fits_ledger_json(item, depth + 1) for item in value.values())
    if isinstance(value, list):
        return all(_fits_ledger_json(item, depth + 1) for item in value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, int):
        return abs(value) <= DOUBLE_INTEGER_EXACT_MAX
    if isinstance(value, float):
        return math.isfinite(value)
    return False


def result_from_receipt(receipt: Receipt, effect_id: str) -> types.CallToolResult:
    """What a DUPLICATE answers: the stored result when the gateway recorded it, else the
    receipt itself as text (an operator settled the effect, or another runtime did it)."""
    meta = _meta(outcome="DUPLICATE", effect_id=effect_id, provider_reference=receipt.reference)
    detail = receipt.detail or {}
    if isinstance(detail.get("mcp_result"), dict):
        try:
            result = types.CallToolResult.model_validate(detail["mcp_result"], by_name=False)
        except ValueError:
            log.warning(
                "effect %s: the stored result is not an MCP result; answering the receipt",
                effect_id,
            )
        else:
            result.meta = {**(result.meta or {}), **meta}
            return result
    if detail.get("truncated"):
        text = (
            f"{detail.get('mcp_result_excerpt', '')}\n[effect-ledger: this call already succeeded; the stored "
            f"result is an excerpt of {detail.get('mcp_result_size_bytes')} bytes, "
            f"sha256 {detail.get('mcp_result_sha256')}]"
        )
    else:
        text = (
            f"This call already succeeded (effect {effect_id}, reference {receipt.reference!r}); "
            f"the ledger's receipt: {canonical_json(detail)}"
        )
    return types.CallToolResult(content=[types.TextContent(text=text)], _meta=meta)


def _meta(**values: Any) -> dict[str, Any]:
    return {f"{META_PREFIX}{name}": value for name, value in values.items() if value not in (None, "")}


def tool_error(text: str, **meta: Any) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True, _meta=_meta(**meta))


def _reasons_text(reasons: list[Reason]) -> str:
    return "; ".join(f"{reason.code}: {reason.message}" for reason in reasons) or "no reason given"


def _reasons_meta(reasons: list[Reason]) -> list[dict[str, str]]:
    return [{"code": reason.code, "message": reason.message} for reason in reasons]


# --- the gateway --------------------------------------------------------------------------------


class _UpstreamRejected(Rejected):
    """The upstream answered isError for a tool configured ``error_outcome = "failed"``: recorded
    FAILED by the guard, then answered as it is."""

    def __init__(self, result: types.CallToolResult) -> None:
        super().__init__(_error_reason(result))
        self.result = result


class _UpstreamUnknown(Exception):
    """The upstream call may have happened (a transport failure, a timeout, a protocol error, or
    an isError answer, unless the tool is configured ``error_outcome = "failed"``): recorded
    UNKNOWN."""

    def __init__(self, cause: str, result: types.CallToolResult | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.result = result


@dataclass
class _Call:
    """One tools/call on its way through the gateway."""

    rule: ToolRule
    arguments: dict[str, Any]
    key: str
    target: str | None
    effect_id: str = ""
    # Set once the upstream answered: from then on, it may have happened.
    result: types.CallToolResult | None = None


def _prose(text: str, keep: str = "\n\t") -> str:
    """``text`` with the characters the ledger refuses in text (docs/decisions.md, "Hostile
    input": control characters, line and paragraph separators, bidi controls) escaped as
    ``\\uXXXX``; ``keep``: the ones prose may hold."""
    return "".join(
        f"\\u{ord(character):04x}" if character not in keep and _refused_in_text(character) else character
        for character in text
    )


def _refused_in_text(character: str) -> bool:
    code = ord(character)
    return (
        code < 0x20
        or 0x7F <= code <= 0x9F
        or code in (0x2028, 0x2029)
        or 0x202A <= code <= 0x202E
        or 0x2066 <= code <= 0x2069
    )


def _error_reason(result: types.CallToolResult) -> str:
    """The reason recorded with an isError answer: its text, bounded, as prose the ledger takes."""
    return _prose(f"the upstream tool answered an error: {_result_text(result)}"[:REASON_CHARACTERS_MAX])


def _result_text(result: types.CallToolResult) -> str:
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return " ".join(texts) or "(no text)"


class Gateway:
    """The MCP server's handlers, over one upstream session and one run."""

    def __init__(self, config: GatewayConfig, ledger: AsyncLedger, run_id: str, upstream: ClientSession) -> None:
        self.config = config
        self.ledger = ledger
        self.run_id = run_id
        self.upstream = upstream

    def server(self) -> Server:
        return Server(
            "effect-ledger-mcp-gateway",
            instructions="Every tool call is authorized by the effect ledger before it reaches the tool.",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def list_tools(self, _context: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        """The upstream's tools that the configuration names. A gated tool is listed without its
        output schema: a repeated call answers from a receipt, which need not carry it."""
        listing = await self.upstream.list_tools(params=params)
        tools = []
        for tool in listing.tools:
            rule = self.config.tools.get(tool.name)
            if rule is None:
                continue
            tools.append(tool.model_copy(update={"output_schema": None}) if rule.gated else tool)
        return types.ListToolsResult(tools=tools, next_cursor=listing.next_cursor)

    async def call_tool(self, _context: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        rule = self.config.tools.get(params.name)
        if rule is None:
            return tool_error(
                f"The gateway does not forward {params.name!r}: its configuration does not name it.",
                outcome="REFUSED",
                reason="TOOL_NOT_CONFIGURED",
            )
        arguments = dict(params.arguments or {})
        if not rule.gated:
            return await self._send_upstream(params.name, arguments, meta=None)
        # Shielded: once the gate has allowed a call, a cancelled request (the client gave up,
        # the gateway is stopping) must still get its outcome recorded; the upstream call is
        # bounded by upstream.call_timeout_seconds.
        with anyio.CancelScope(shield=True):
            result = await self._guarded(rule, arguments)
        return result

    async def _guarded(self, rule: ToolRule, arguments: dict[str, Any]) -> types.CallToolResult:
        try:
            call = _Call(
                rule,
                arguments,
                idempotency_key(rule, self.run_id, arguments),
                render_target(rule.target, arguments),
            )
        except Refusal as refusal:
            return tool_error(
                f"The gateway refused the call: {refusal}.",
                outcome="REFUSED",
                reason=refusal.reason,
            )
        try:
            async with self.ledger.guard(
                self.run_id,
                rule.ledger_tool,
                arguments,
                key=call.key,
                target=call.target,
                approval_timeout_seconds=self.config.approval_wait_seconds,
            ) as effect:
                call.effect_id = effect.effect_id
                await self._forward(effect, call)
        except (AlreadySucceeded, ApprovalTimeout, Denied, ReconcileRequired) as answer:
            return self._gate_answer(rule, answer)
        except _UpstreamRejected as rejected:
            return _with_meta(rejected.result, outcome="FAILED", effect_id=call.effect_id)
        except _UpstreamUnknown as unknown:
            return self._unknown_answer(call, unknown)
        except LedgerError as error:
            return self._ledger_failure(call, error)
        except ValueError as error:  # arguments the guard cannot send (not JSON, over 64 KiB)
            return tool_error(
                f"The gateway refused the call: {error}.",
                outcome="REFUSED",
                reason="ARGUMENTS_INVALID",
            )
        assert call.result is not None, "a guarded call that returns has the upstream's result"
        return _with_meta(call.result, outcome="SUCCEEDED", effect_id=call.effect_id)

    async def _forward(self, effect: Any, call: _Call) -> None:
        """Inside the guard, after ALLOW: call the upstream once and report what it answered."""
        meta = _meta(provider_key=effect.provider_key, effect_id=effect.effect_id)
        try:
            result = await self._send_upstream(call.rule.name, call.arguments, meta=meta, raise_errors=True)
        except Exception as error:  # whatever went wrong after sending, it may have happened
            raise _UpstreamUnknown(f"{type(error).__name__}: {error}") from error
        call.result = result
        if result.is_error and call.rule.error_outcome == "unknown":
            raise _UpstreamUnknown(_error_reason(result), result)
        if result.is_error:
            raise _UpstreamRejected(result)
        await effect.succeeded(
            _prose(f"mcp:{call.rule.name}/{effect.attempt_id}", keep=""),
            detail=receipt_detail(result),
        )

    async def _send_upstream(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        meta: dict[str, Any] | None,
        raise_errors: bool = False,
    ) -> types.CallToolResult:
        """tools/call on the upstream, without the client session's output-schema check: a result
        the upstream produced is its answer, valid or not, and it already happened."""
        request = types.CallToolRequest(
            params=types.CallToolRequestParams.model_validate({"name": name, "arguments": arguments, "_meta": meta})
        )
        try:
            return await self.upstream.send_request(
                request,
                types.CallToolResult,
                request_read_timeout_seconds=self.config.upstream_call_timeout_seconds,
            )
        except Exception as error:
            if raise_errors:
                raise
            return tool_error(
                f"The upstream call failed: {type(error).__name__}: {error}",
                outcome="UPSTREAM_ERROR",
            )

    def _gate_answer(self, rule: ToolRule, answer: Exception) -> types.CallToolResult:
        """The gate did not allow the call: the upstream was not called."""
        tool = rule.ledger_tool
        if isinstance(answer, AlreadySucceeded):
            return result_from_receipt(answer.receipt, answer.effect_id)
        if isinstance(answer, ApprovalTimeout):
            return tool_error(
                f"{tool} needs a reviewer's approval: approval request {answer.approval_id} is pending. "
                "Nothing was sent. Retry this exact call (same arguments) after a reviewer decides.",
                outcome="REQUIRE_APPROVAL",
                approval_request_id=answer.approval_id,
            )
        if isinstance(answer, ApprovalDenied):
            return tool_error(
                f"{tool} was not sent: a reviewer denied approval request {answer.approval_id} "
                f"({_reasons_text(answer.reasons)}).",
                outcome="DENY",
                approval_request_id=answer.approval_id,
                decision_id=answer.decision_id,
                reasons=_reasons_meta(answer.reasons),
            )
        if isinstance(answer, Denied):
            return tool_error(
                f"{tool} was not sent: the effect ledger denied it ({_reasons_text(answer.reasons)}).",
                outcome="DENY",
                decision_id=answer.decision_id,
                reasons=_reasons_meta(answer.reasons),
            )
        assert isinstance(answer, ReconcileRequired), answer
        return tool_error(
            f"{tool} was not sent: an earlier attempt of this call (effect {answer.effect_id}, "
            f"{answer.stage}) may have happened. It must be reconciled in the effect ledger before "
            "the call can run again.",
            outcome="RECONCILE_REQUIRED",
            effect_id=answer.effect_id,
            stage=answer.stage,
            decision_id=answer.decision_id,
            reasons=_reasons_meta(answer.reasons),
        )

    def _unknown_answer(self, call: _Call, unknown: _UpstreamUnknown) -> types.CallToolResult:
        if unknown.result is not None:
            return _with_meta(unknown.result, outcome="UNKNOWN", effect_id=call.effect_id)
        return tool_error(
            f"The call to {call.rule.name} failed after it was sent ({unknown.cause}): it may or may "
            f"not have happened. Effect {call.effect_id} is recorded UNKNOWN and must be reconciled "
            "in the effect ledger before the call can run again.",
            outcome="UNKNOWN",
            effect_id=call.effect_id,
        )

    def _ledger_failure(self, call: _Call, error: LedgerError) -> types.CallToolResult:
        if call.result is None:
            return tool_error(
                f"{call.rule.ledger_tool} was not sent: the effect ledger refused or failed "
                f"({error.reason}: {error.message}).",
                outcome="REFUSED",
                reason=error.reason,
                effect_id=call.effect_id,
            )
        # The upstream did it, but its success could not be recorded: the guard reported
        # UNKNOWN where it could, and an operator settles it with the result below.
        log.error(
            "effect %s: the upstream succeeded but the ledger did not record it: %r",
            call.effect_id,
            error,
        )
        note = types.TextContent(
            text=f"[effect-ledger: the call ran, but the ledger did not record its outcome ({error.reason}); "
            f"effect {call.effect_id} must be reconciled]"
        )
        result = call.result.model_copy(update={"content": [*call.result.content, note]})
        return _with_meta(result, outcome="UNKNOWN", effect_id=call.effect_id, reason=error.reason)


def _with_meta(result: types.CallToolResult, **meta: Any) -> types.CallToolResult:
    return result.model_copy(update={"meta": {**(result.meta or {}), **_meta(**meta)}})


# --- running it ---------------------------------------------------------------------------------


def _token(variable: str) -> str:
    token = os.environ.get(variable, "")
    if not token:
        raise ConfigError(f"the environment variable {variable} (the ledger token) is not set")
    return token


def _ledger(config: GatewayConfig, token: str) -> AsyncLedger:
    return AsyncLedger(
        config.ledger_target,
        token,
        root_certificates=config.root_certificates,
        client_certificate=config.client_certificate,
        client_key=config.client_key,
        timeout_seconds=config.ledger_timeout_seconds,
    )


async def resolve_run(ledger: AsyncLedger, config: GatewayConfig) -> str:
    """The configured run, checked; or the run CreateRun makes for the request id (the same
    run again after a restart)."""
    if config.run_id:
        return (await ledger.runs.GetRun(runs_pb2.GetRunRequest(run_id=config.run_id))).run_id
    run = await ledger.runs.CreateRun(
        runs_pb2.CreateRunRequest(request_id=config.run_request_id, labels=config.run_labels, adapter=RUN_ADAPTER)
    )
    return run.run_id


def upstream_parameters(config: GatewayConfig) -> StdioServerParameters:
    """The upstream gets a small default environment (PATH, HOME, ...) plus ``upstream.env``;
    never the gateway's own, so the ledger token stays out of it."""
    return StdioServerParameters(
        command=config.upstream_command[0],
        args=list(config.upstream_command[1:]),
        env=config.upstream_env,
        cwd=config.upstream_cwd,
    )


async def serve(config: GatewayConfig) -> None:
    async with _ledger(config, _token(config.token_env)) as ledger:
        run_id = await resolve_run(ledger, config)
        log.info("gating tools/call into run %s", run_id)
        async with (
            stdio_client(upstream_parameters(config)) as (read, write),
            ClientSession(read, write) as upstream,
        ):
            await upstream.initialize()
            server = Gateway(config, ledger, run_id, upstream).server()
            async with stdio_server() as (server_read, server_write):
                await server.run(server_read, server_write, server.create_initialization_options())


def contract_request(tool: str, settings: Mapping[str, Any]) -> tools_pb2.PutToolContractRequest:
    """A ``[contracts."<tool>"]`` table as PutToolContract: ToolContract's fields by their proto
    names (enums by name), with ``arguments_schema`` as a table instead of JSON bytes."""
    fields = dict(settings)
    schema = fields.pop("arguments_schema", None)
    contract = tools_pb2.ToolContract()
    try:
        json_format.ParseDict({**fields, "tool": tool}, contract)
    except json_format.ParseError as error:
        raise ConfigError(f"contracts.{tool}: {error}") from None
    if schema is not None:
        contract.arguments_schema_json = canonical_json(schema).encode()
    return tools_pb2.PutToolContractRequest(contract=contract)


async def register_contracts(config: GatewayConfig) -> list[tools_pb2.ToolContract]:
    """PutToolContract every configured contract with the admin token (setup convenience)."""
    if not config.contracts:
        raise ConfigError("contracts: the configuration names no contract")
    if not config.admin_token_env:
        raise ConfigError("ledger.admin_token_env: needed to register contracts")
    requests = [contract_request(tool, settings) for tool, settings in config.contracts.items()]
    async with _ledger(config, _token(config.admin_token_env)) as ledger:
        return [await ledger.tools.PutToolContract(request) for request in requests]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m effect_ledger_client.adapters.mcp_gateway",
        description="An MCP server that asks the effect ledger before forwarding each tools/call to an upstream MCP server.",
    )
    parser.add_argument("--config", required=True, help="gateway.toml (or .json)")
    parser.add_argument(
        "--register-contracts",
        action="store_true",
        help="register the configuration's [contracts] with the admin token, then exit",
    )
    arguments = parser.parse_args(argv)
    # stdout carries MCP messages: everything else goes to stderr.
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        config = load_config(arguments.config)
        if arguments.register_contracts:
            for contract in anyio.run(register_contracts, config):
                print(f"registered {contract.tool} revision {contract.revision}", file=sys.stderr)
            return 0
        anyio.run(serve, config)
    except (ConfigError, OSError) as error:
        print(f"mcp_gateway: {error}", file=sys.stderr)
        return 2
    except LedgerError as error:
        print(
            f"mcp_gateway: the effect ledger refused: {error.reason}: {error.message}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
