"""OpenAI Agents SDK: function tools gated by the effect ledger (extra
``effect-ledger-client[openai-agents]``).

    from effect_ledger_client.adapters.openai_agents import guard_function_tool

    send = guard_function_tool(send_email, ledger, ledger_tool="email.send")
    agent = Agent(name="mailer", tools=[send])
    result = await Runner.run(agent, "...", context=AppContext(ledger_run_id=run_id))

Every invocation runs under ``Ledger.guard``:

- **Run**: ``run_id=`` a run id, or a function of the run's context object (what
  ``Runner.run(..., context=...)`` was given). By default the context's ``ledger_run_id``
  attribute, or its ``"ledger_run_id"`` key for a dict. The SDK has no run identity of its own
  that survives a resume, so the application creates the run (``CreateRun``, with a
  ``request_id`` it can repeat) and passes it.
- **Key**: ``<run id>/<tool call id>`` (``sha256-<hex>`` of it when it is not 1 to 256 printable
  ASCII characters without spaces); ``key=`` takes a function of a ``ToolCallInfo``. A
  ``RunState`` resumed after an interruption keeps its call ids, so it names the same effects.
- **ALLOW**: the tool runs once; its output is the receipt (``reference`` = the call id,
  ``detail`` = ``{"output": ...}`` when it fits). ``effect_ledger_client.Rejected`` raised by the
  tool records FAILED; any other exception records UNKNOWN (it may have happened) and is then
  handed to the tool's own failure policy (``failure_error_function``: by default a generic
  message to the model; ``None``: the run fails).
- **DUPLICATE**: the tool does not run; the recorded output is returned.
- **DENY, a denied approval, RECONCILE_REQUIRED**: the tool does not run; the model gets a text
  naming the reasons (``effect-ledger: ... was denied (CODE: message)``), as SDK tools report
  errors.
- **REQUIRE_APPROVAL** uses the SDK's own human-in-the-loop: the guarded tool's
  ``needs_approval`` asks the ledger before the call (``AuthorizeEffect`` without dispatch) and
  answers True when the ledger requires an approval, so the run stops with an interruption
  (``result.interruptions``). ``ledger_approval_id(item)`` names the ledger's approval request of
  an interruption; a reviewer decides it (``DecideApproval``); the application then approves the
  interruption (``state.approve(item)``) and resumes (``Runner.run(agent, state)``): the tool is
  authorized again and runs only if the ledger allows it. Approving in the SDK is not enough: a
  still-pending request gives the model a text naming it, and a denied one a denial. When the
  ledger's answer to that question is ALLOW, the attempt it made is released at once (never
  dispatched) and the invocation authorizes its own. The wrapped tool's own ``needs_approval``
  is kept: either one asks for approval. ``ledger_approvals=False`` skips the question; the
  invocation then answers a pending approval with the text naming it.

Only the sync ``Ledger`` is supported: its calls run in worker threads (``asyncio.to_thread``)
so the event loop is never blocked; the tool's body runs on the loop.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agents import FunctionTool, RunContextWrapper
from agents.tool import (
    resolve_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext

from effect_ledger_client import (
    AlreadySucceeded,
    ApprovalDenied,
    ApprovalTimeout,
    Denied,
    GuardError,
    Ledger,
    ReconcileRequired,
)
from effect_ledger_client.adapters._common import (
    identifier,
    output_detail,
    replayed_output,
)
from effect_ledger_client.proto import common_pb2, gate_pb2

RUN_ID_ATTRIBUTE = "ledger_run_id"
# Interruptions whose ledger request is remembered; the oldest are forgotten beyond this.
PENDING_APPROVALS_MAX = 10_000


@dataclass(frozen=True)
class ToolCallInfo:
    """What a key function is given."""

    run_id: str
    tool_call_id: str
    tool: str
    arguments: dict[str, Any]


def default_key(call: ToolCallInfo) -> str:
    return identifier(f"{call.run_id}/{call.tool_call_id}")


def refusal_text(tool: str, error: GuardError) -> str:
    """The model-visible reason a tool did not run."""
    if isinstance(error, ApprovalDenied):
        return f"effect-ledger: {tool} was not run: approval {error.approval_id} was denied by a reviewer"
    if isinstance(error, Denied):
        reasons = "; ".join(f"{reason.code}: {reason.message}" for reason in error.reasons)
        return f"effect-ledger: {tool} was denied ({reasons or 'no reason given'})"
    if isinstance(error, ReconcileRequired):
        return (
            f"effect-ledger: {tool} was not run: an earlier attempt of this call (effect "
            f"{error.effect_id}) is {error.stage} and may have happened; it must be reconciled first"
        )
    if isinstance(error, ApprovalTimeout):
        return (
            f"effect-ledger: {tool} was not run: it needs approval {error.approval_id}, which is still "
            "pending; a reviewer must decide it before the call can run"
        )
    return f"effect-ledger: {tool} was not run: {error}"


def run_id_from_context(context: Any) -> str:
    """The default run id: ``context.ledger_run_id``, or ``context["ledger_run_id"]``."""
    if isinstance(context, Mapping):
        run_id = context.get(RUN_ID_ATTRIBUTE)
    else:
        run_id = getattr(context, RUN_ID_ATTRIBUTE, None)
    if not run_id:
        raise ValueError(
            f"no ledger run id: pass run_id= to guard_function_tool, or give the run a context with "
            f"a {RUN_ID_ATTRIBUTE!r} attribute or key"
        )
    return str(run_id)


class _Gate:
    """One guarded tool's ledger side: the question before the call and the guarded call."""

    def __init__(self, tool: FunctionTool, ledger: Ledger, *, ledger_tool, run_id, key, target, estimate) -> None:
        if not isinstance(ledger, Ledger):
            raise TypeError("guard_function_tool needs a sync effect_ledger_client.Ledger")
        self.original = tool
        # A copy whose failures raise: the guard must see them to record UNKNOWN or FAILED.
        self.raising = copy.copy(tool)
        set_function_tool_failure_error_function(self.raising, None)
        self.ledger = ledger
        self.ledger_tool = ledger_tool or tool.name
        self.run_id = run_id
        self.key = key or default_key
        self.target = target
        self.estimate = estimate
        self.pending_approvals: dict[str, str] = {}  # tool call id -> ledger approval request id

    def call_info(self, context: Any, call_id: str, arguments: dict[str, Any]) -> ToolCallInfo:
        run_id = self.run_id(context) if callable(self.run_id) else (self.run_id or run_id_from_context(context))
        return ToolCallInfo(run_id=run_id, tool_call_id=call_id, tool=self.ledger_tool, arguments=arguments)

    def _resolved(self, value, arguments: dict[str, Any]):
        return value(arguments) if callable(value) else value

    def authorize_request(self, call: ToolCallInfo) -> gate_pb2.AuthorizeEffectRequest:
        return gate_pb2.AuthorizeEffectRequest(
            run_id=call.run_id,
            tool=self.ledger_tool,
            idempotency_key=self.key(call),
            arguments_json=json.dumps(call.arguments, separators=(",", ":")).encode(),
            target=self._resolved(self.target, call.arguments) or self.ledger_tool,
            estimate=dict(self._resolved(self.estimate, call.arguments) or {}),
        )

    async def needs_approval(self, wrapper: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str) -> bool:
        """The SDK's question before a call: does the ledger require an approval for it?"""
        original = self.original.needs_approval
        if original is True or (callable(original) and await _maybe_await(original(wrapper, arguments, call_id))):
            return True
        call = self.call_info(wrapper.context, call_id, arguments)
        return await asyncio.to_thread(self._ask_ledger, call)

    def _ask_ledger(self, call: ToolCallInfo) -> bool:
        response = self.ledger.gate.AuthorizeEffect(self.authorize_request(call))
        if response.outcome == common_pb2.ALLOW:
            # Never dispatched: released, so the invocation's own ALLOW is the one that counts.
            self.ledger.gate.ReleaseAttempt(
                gate_pb2.ReleaseAttemptRequest(
                    attempt_id=response.attempt_id, reason="asked before the call; the call authorizes its own"
                )
            )
            return False
        if response.outcome != common_pb2.REQUIRE_APPROVAL:
            return False
        if len(self.pending_approvals) >= PENDING_APPROVALS_MAX:
            self.pending_approvals.pop(next(iter(self.pending_approvals)))
        self.pending_approvals[call.tool_call_id] = response.approval_request_id
        return True

    async def invoke(self, context: ToolContext[Any], input: str) -> Any:
        arguments = json.loads(input) if input.strip() else {}
        call = self.call_info(context.context, context.tool_call_id, arguments)
        guard = self.ledger.guard(
            call.run_id,
            self.ledger_tool,
            call.arguments,
            key=self.key(call),
            target=self._resolved(self.target, call.arguments),
            estimate=self._resolved(self.estimate, call.arguments),
            approval_timeout_seconds=0.0,
        )
        try:
            effect = await asyncio.to_thread(guard.__enter__)
        except AlreadySucceeded as done:
            return replayed_output(done.receipt)
        except GuardError as refusal:
            return refusal_text(self.ledger_tool, refusal)
        self.pending_approvals.pop(call.tool_call_id, None)
        try:
            output = await self.raising.on_invoke_tool(context, input)
            await asyncio.to_thread(effect.succeeded, call.tool_call_id, output_detail(_jsonable(output)))
        except BaseException as error:
            await asyncio.to_thread(guard.__exit__, type(error), error, error.__traceback__)
            if not isinstance(error, Exception):
                raise
            return await self._failure_output(context, error)
        await asyncio.to_thread(guard.__exit__, None, None, None)
        return output

    async def _failure_output(self, context: ToolContext[Any], error: Exception) -> Any:
        """What the original tool's failure policy makes of an error, or the error raised."""
        formatter = resolve_function_tool_failure_error_function(self.original, context)
        if formatter is None:
            raise error
        return await _maybe_await(formatter(context, error))


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


def _jsonable(output: Any) -> Any:
    if isinstance(output, (str, int, float, bool)) or output is None:
        return output
    dump = getattr(output, "model_dump", None)
    return dump(mode="json") if callable(dump) else str(output)


def guard_function_tool(
    tool: FunctionTool,
    ledger: Ledger,
    *,
    ledger_tool: str | None = None,
    run_id: str | Callable[[Any], str] | None = None,
    key: Callable[[ToolCallInfo], str] | None = None,
    target: str | Callable[[dict[str, Any]], str] | None = None,
    estimate: Mapping[str, int] | Callable[[dict[str, Any]], Mapping[str, int]] | None = None,
    ledger_approvals: bool = True,
) -> FunctionTool:
    """A copy of ``tool`` whose every invocation is authorized by the ledger (module docstring).

    ``ledger_tool``: the contract's name (default: the tool's name). ``run_id``: a run id, or a
    function of the run's context object. ``key``: a function of a ``ToolCallInfo``. ``target``,
    ``estimate``: values or functions of the call's arguments (``target`` defaults to the tool's
    name). ``ledger_approvals``: ask the ledger in ``needs_approval`` (the SDK's interruptions)."""
    gate = _Gate(tool, ledger, ledger_tool=ledger_tool, run_id=run_id, key=key, target=target, estimate=estimate)
    guarded = copy.copy(tool)
    guarded.on_invoke_tool = gate.invoke
    if ledger_approvals:
        guarded.needs_approval = gate.needs_approval
    guarded.__dict__["_effect_ledger_gate"] = gate
    return guarded


def ledger_approval_id(item: Any, tool: FunctionTool | None = None) -> str | None:
    """The ledger approval request behind an interruption (a ``ToolApprovalItem``), or None.
    ``tool``: the guarded tool; by default the interruption's call id is looked up in every
    guarded tool given, so pass it when several guarded tools share call ids."""
    call_id = getattr(item.raw_item, "call_id", None) or getattr(item, "call_id", None)
    gates = [tool.__dict__.get("_effect_ledger_gate")] if tool is not None else list(_gates_of(item))
    for gate in gates:
        if gate is not None and call_id in gate.pending_approvals:
            return gate.pending_approvals[call_id]
    return None


def _gates_of(item: Any):
    agent = getattr(item, "agent", None)
    for candidate in getattr(agent, "tools", None) or []:
        gate = getattr(candidate, "__dict__", {}).get("_effect_ledger_gate")
        if gate is not None:
            yield gate


__all__ = ["ToolCallInfo", "default_key", "guard_function_tool", "identifier", "ledger_approval_id"]
