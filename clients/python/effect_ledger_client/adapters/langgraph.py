"""LangGraph: LangChain tools gated by the effect ledger (extra ``effect-ledger-client[langgraph]``).

    from effect_ledger_client.adapters.langgraph import guard_tools

    tools = guard_tools([send_email], ledger, ledger_tool={"send_email": "email.send"})
    graph.add_node("tools", ToolNode(tools))
    app = graph.compile(checkpointer=InMemorySaver())      # approvals need a checkpointer

Every call of a guarded tool runs under ``Ledger.guard``:

- **Run**: the LangGraph thread (``config["configurable"]["thread_id"]``) is the ledger run,
  found or made by ``CreateRun(request_id=<thread id>)``, which returns the same run for the same
  request id in a tenant. A thread id that is not 1 to 256 printable ASCII characters without
  spaces becomes ``sha256-<hex of the thread id>``. ``run_request_id`` changes the mapping.
- **Key**: ``<thread id>/<tool call id>`` (hashed the same way when it is not an identifier), so a
  graph that replays a tool call (a resume re-runs the whole tool node) names the same effect.
  ``key=`` takes a function of a ``ToolCallInfo`` instead. A call without a tool call id (a tool
  invoked with bare arguments) needs that function.
- **ALLOW**: the wrapped tool runs once; its output is recorded as the receipt (``reference`` =
  the tool call id, ``detail`` = ``{"output": ...}`` when it fits in the ledger's 64 KiB).
  ``effect_ledger_client.Rejected`` raised by the tool records FAILED; any other exception, or
  a ToolMessage with status "error" (a tool that handles its own errors), records UNKNOWN: it may
  have happened, and the next call of the same key answers RECONCILE_REQUIRED.
- **DUPLICATE**: the tool does not run; the recorded output comes back as the ToolMessage.
- **REQUIRE_APPROVAL**: ``interrupt(...)`` with the approval request (see ``approval_payload``),
  so the graph pauses. After a reviewer's ``DecideApproval``, ``Command(resume=...)`` runs the
  tool node again: the tool is authorized again and runs if the ledger now allows it (the resume
  value is not trusted: the ledger's answer decides). Still pending: it interrupts again.
- **DENY, a denied approval, RECONCILE_REQUIRED**: the tool does not run, and the call returns a
  ToolMessage with ``status="error"`` whose content names the reasons, as LangChain tools report
  errors to the model (``handle_tool_error``). The graph goes on; the model sees why. Invoked
  with bare arguments instead of a tool call, the same error is raised as ``LedgerToolError``.

Sync: ``invoke`` uses a ``Ledger``; ``ainvoke`` runs the same path in a worker thread, so the
wrapped tool needs a sync implementation. The wrapped tool must not call ``interrupt`` itself:
a body stopped after its dispatch is an UNKNOWN effect.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config
from langchain_core.tools import BaseTool, ToolException
from langgraph.types import interrupt
from pydantic import ConfigDict, PrivateAttr

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
from effect_ledger_client.proto import approvals_pb2, runs_pb2

# The ledger's identifiers (run request ids, idempotency keys): printable ASCII, no spaces.
# Tool output kept in the receipt; larger output is kept as its digest (the ledger's limit on
# receipt detail is 64 KiB, and the JSON wrapping needs some of it).
# How many times one tool call interrupts for an approval that is still pending before it gives
# up with an error message (each resume of a still-pending request costs one).
APPROVAL_INTERRUPTS_MAX = 16
ADAPTER_NAME = "langgraph"
INTERRUPT_TYPE = "effect_ledger.approval_required"


@dataclass(frozen=True)
class ToolCallInfo:
    """What a key function is given: the thread, the call, and the tool's arguments."""

    thread_id: str
    tool_call_id: str | None
    tool: str
    arguments: dict[str, Any]


class LedgerToolError(ToolException):
    """The ledger did not let the tool run (raised only for bare-argument invocations; a tool
    call gets a ToolMessage with status "error" carrying the same text)."""

    def __init__(self, message: str, cause: GuardError | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class StillPending(ApprovalTimeout):
    """The graph was resumed APPROVAL_INTERRUPTS_MAX times while the approval stayed pending."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(approval_id, 0.0)


def default_key(call: ToolCallInfo) -> str:
    if not call.tool_call_id:
        raise ValueError(f"tool {call.tool!r} was invoked without a tool call id: give guard_tool a key function")
    return identifier(f"{call.thread_id}/{call.tool_call_id}")


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
        return f"effect-ledger: {tool} was not run: approval {error.approval_id} is still pending"
    return f"effect-ledger: {tool} was not run: {error}"


def schema_fields(tool: BaseTool) -> set[str] | None:
    """The arguments the model gives (injected ones left out), or None when unknown."""
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return set(schema.get("properties", {}))
    fields = getattr(schema, "model_fields", None)
    return set(fields) if fields is not None else None


class GuardedTool(BaseTool):
    """A LangChain tool whose every call is authorized by the ledger first (module docstring).
    Made by ``guard_tool``; keeps the wrapped tool's name, description and argument schema."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    wrapped: BaseTool
    ledger: Any
    ledger_tool: str
    key: Callable[[ToolCallInfo], str] | None = None
    target: Callable[[dict[str, Any]], str] | str | None = None
    estimate: Callable[[dict[str, Any]], Mapping[str, int]] | Mapping[str, int] | None = None
    run_request_id: Callable[[str], str] | None = None

    _runs: dict[str, str] = PrivateAttr(default_factory=dict)
    _runs_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"call {self.name} through invoke() (or a ToolNode), not run()")

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        config = ensure_config(config)
        is_tool_call = isinstance(input, dict) and input.get("type") == "tool_call"
        tool_call_id = input.get("id") if is_tool_call else None
        call = ToolCallInfo(
            thread_id=self._thread_id(config),
            tool_call_id=tool_call_id,
            tool=self.ledger_tool,
            arguments=self._model_arguments(input["args"] if is_tool_call else input),
        )
        try:
            return self._authorized_invoke(input, config, call, **kwargs)
        except GuardError as refusal:
            text = refusal_text(self.ledger_tool, refusal)
            if tool_call_id is None:
                raise LedgerToolError(text, refusal) from refusal
            return ToolMessage(content=text, name=self.name, tool_call_id=tool_call_id, status="error")

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.invoke, input, ensure_config(config), **kwargs)

    def run_id_for(self, thread_id: str) -> str:
        """The ledger run of a thread: CreateRun with the thread's request id (cached)."""
        with self._runs_lock:
            run_id = self._runs.get(thread_id)
        if run_id is None:
            request_id = identifier(self.run_request_id(thread_id) if self.run_request_id else thread_id)
            run_id = self.ledger.runs.CreateRun(
                runs_pb2.CreateRunRequest(request_id=request_id, adapter=ADAPTER_NAME)
            ).run_id
            with self._runs_lock:
                self._runs[thread_id] = run_id
        return run_id

    def _authorized_invoke(self, input: Any, config: RunnableConfig, call: ToolCallInfo, **kwargs: Any) -> Any:
        run_id = self.run_id_for(call.thread_id)
        key = (self.key or default_key)(call)
        approval_id = ""
        for _ in range(APPROVAL_INTERRUPTS_MAX):
            try:
                return self._guarded_invoke(run_id, key, input, config, call, **kwargs)
            except ApprovalTimeout as pending:
                approval_id = pending.approval_id
            # Pauses the graph (GraphInterrupt) until resumed; on a resume it returns and the
            # ledger is asked again.
            interrupt(self.approval_payload(run_id, approval_id, call))
        raise StillPending(approval_id)

    def _guarded_invoke(
        self, run_id: str, key: str, input: Any, config: RunnableConfig, call: ToolCallInfo, **kwargs: Any
    ) -> Any:
        target = self.target(call.arguments) if callable(self.target) else self.target
        estimate = self.estimate(call.arguments) if callable(self.estimate) else self.estimate
        guard = self.ledger.guard(
            run_id,
            self.ledger_tool,
            call.arguments,
            key=key,
            target=target,
            estimate=estimate,
            approval_timeout_seconds=0.0,
        )
        try:
            effect = guard.__enter__()
        except AlreadySucceeded as done:
            return self._replayed(done.receipt, call)
        try:
            result = self.wrapped.invoke(input, config, **kwargs)
            if isinstance(result, ToolMessage) and result.status == "error":
                effect.unknown(f"the tool reported an error: {str(result.content)[:200]}")
            else:
                content = result.content if isinstance(result, ToolMessage) else result
                effect.succeeded(call.tool_call_id or key, detail=output_detail(content))
        except BaseException as error:
            guard.__exit__(type(error), error, error.__traceback__)
            raise
        guard.__exit__(None, None, None)
        return result

    def _replayed(self, receipt, call: ToolCallInfo) -> Any:
        output = replayed_output(receipt)
        if call.tool_call_id is None:
            return output
        return ToolMessage(content=output, name=self.name, tool_call_id=call.tool_call_id)

    def approval_payload(self, run_id: str, approval_id: str, call: ToolCallInfo) -> dict[str, Any]:
        """The value given to ``interrupt``: what a reviewer's UI needs to find the request."""
        approval = self.ledger.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=approval_id))
        return {
            "type": INTERRUPT_TYPE,
            "approval_request_id": approval_id,
            "state": approvals_pb2.ApprovalState.Name(approval.state),
            "run_id": run_id,
            "tool": self.ledger_tool,
            "target": approval.target,
            "arguments": call.arguments,
            "tool_call_id": call.tool_call_id,
            "quorum": approval.quorum,
            "expires_at": approval.expires_at.ToJsonString() if approval.HasField("expires_at") else None,
        }

    def _thread_id(self, config: RunnableConfig) -> str:
        thread_id = config.get("configurable", {}).get("thread_id")
        if thread_id is None or thread_id == "":
            raise ValueError(
                f"{self.name}: no thread_id in config['configurable']: the ledger run comes from the thread"
            )
        return str(thread_id)

    def _model_arguments(self, arguments: Any) -> dict[str, Any]:
        if isinstance(arguments, str):
            return {"input": arguments}
        fields = schema_fields(self.wrapped)
        return {name: value for name, value in dict(arguments).items() if fields is None or name in fields}


def guard_tool(
    tool: BaseTool | Callable,
    ledger: Ledger,
    *,
    ledger_tool: str | None = None,
    key: Callable[[ToolCallInfo], str] | None = None,
    target: Callable[[dict[str, Any]], str] | str | None = None,
    estimate: Callable[[dict[str, Any]], Mapping[str, int]] | Mapping[str, int] | None = None,
    run_request_id: Callable[[str], str] | None = None,
) -> GuardedTool:
    """Gate one tool (a ``BaseTool``, e.g. from ``@tool``, or a plain function, made a tool).

    ``ledger_tool``: the contract's tool name (default: the tool's name). ``key``: a function of
    a ``ToolCallInfo`` returning the idempotency key. ``target``, ``estimate``: values or
    functions of the model-given arguments (``target`` defaults to the tool's name).
    ``run_request_id``: a function of the thread id giving CreateRun's request id."""
    if not isinstance(tool, BaseTool):
        from langchain_core.tools import tool as make_tool

        tool = make_tool(tool)
    return GuardedTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        return_direct=tool.return_direct,
        response_format=tool.response_format,
        wrapped=tool,
        ledger=ledger,
        ledger_tool=ledger_tool or tool.name,
        key=key,
        target=target,
        estimate=estimate,
        run_request_id=run_request_id,
    )


def guard_tools(
    tools: Iterable[BaseTool | Callable],
    ledger: Ledger,
    *,
    ledger_tool: Mapping[str, str] | None = None,
    **options: Any,
) -> list[GuardedTool]:
    """``guard_tool`` for each tool; ``ledger_tool`` maps tool names to contract names."""
    guarded: list[GuardedTool] = []
    for tool in tools:
        name = tool.name if isinstance(tool, BaseTool) else getattr(tool, "__name__", "")
        guarded.append(guard_tool(tool, ledger, ledger_tool=(ledger_tool or {}).get(name), **options))
    return guarded


__all__: Sequence[str] = [
    "GuardedTool",
    "LedgerToolError",
    "ToolCallInfo",
    "default_key",
    "guard_tool",
    "guard_tools",
    "identifier",
]
