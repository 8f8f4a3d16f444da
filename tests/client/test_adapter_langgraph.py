"""The LangGraph adapter against a real server, on PostgreSQL and on SQLite: a graph with a
ToolNode fed a tool call directly (no model), checkpointed in memory so approvals can pause it."""

from __future__ import annotations

import json
import uuid

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from effect_ledger_client import Rejected
from effect_ledger_client.adapters.langgraph import guard_tool
from effect_ledger_client.proto import approvals_pb2, common_pb2, gate_pb2, runs_pb2

from .conftest import IRREVERSIBLE_TOOL, register, register_irreversible

ARGUMENTS = {"to": "bob@example.com", "subject": "hello"}


class Recorder:
    """A side effect that counts its calls."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def tool(self, name: str = "send_email", fails_with: BaseException | None = None):
        @tool(name)
        def send_email(to: str, subject: str) -> str:
            """Send an email."""
            self.calls.append({"to": to, "subject": subject})
            if fails_with is not None:
                raise fails_with
            return f"sent {subject!r} to {to} (#{len(self.calls)})"

        return send_email


def graph_with(guarded):
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([guarded]))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile(checkpointer=InMemorySaver())


def tool_call_message(name: str, call_id: str, arguments: dict = ARGUMENTS) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": arguments, "id": call_id, "type": "tool_call"}])


def thread(thread_id: str) -> dict:
    return {"configurable": {"thread_id": thread_id}}


def last_tool_message(state) -> ToolMessage:
    message = state["messages"][-1]
    assert isinstance(message, ToolMessage), message
    return message


def ask_again(ledger, run_id: str, tool: str, key: str, arguments: dict = ARGUMENTS, target: str = ""):
    """AuthorizeEffect with the adapter's run, key and arguments: DUPLICATE once it succeeded."""
    return ledger.gate.AuthorizeEffect(
        gate_pb2.AuthorizeEffectRequest(
            run_id=run_id,
            tool=tool,
            idempotency_key=key,
            target=target or tool,
            arguments_json=json.dumps(arguments).encode(),
        )
    )


def run_of_thread(ledger, thread_id: str) -> str:
    return ledger.runs.CreateRun(runs_pb2.CreateRunRequest(request_id=thread_id)).run_id


def outcome(response) -> str:
    return common_pb2.Outcome.Name(response.outcome)


def test_create_run_with_the_same_request_id_returns_the_same_run(ledger):
    thread_id = f"thread-{uuid.uuid4().hex}"
    assert run_of_thread(ledger, thread_id) == run_of_thread(ledger, thread_id)
    assert run_of_thread(ledger, thread_id) != run_of_thread(ledger, f"{thread_id}-other")


def test_an_allowed_tool_runs_once_and_its_effect_succeeds(ledger, admin_ledger):
    register(admin_ledger, "email.send")
    recorder = Recorder()
    app = graph_with(guard_tool(recorder.tool(), ledger, ledger_tool="email.send"))
    thread_id = f"thread-{uuid.uuid4().hex}"

    state = app.invoke({"messages": [tool_call_message("send_email", "call_1")]}, thread(thread_id))

    message = last_tool_message(state)
    assert message.status == "success" and message.content == "sent 'hello' to bob@example.com (#1)"
    assert recorder.calls == [ARGUMENTS]
    # The thread's run, the key <thread id>/<tool call id>, the output kept as the receipt.
    run_id = run_of_thread(ledger, thread_id)
    again = ask_again(ledger, run_id, "email.send", f"{thread_id}/call_1")
    assert outcome(again) == "DUPLICATE"
    effect = ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=again.effect_id))
    assert common_pb2.Stage.Name(effect.stage) == "SUCCEEDED" and effect.run_id == run_id
    assert json.loads(effect.receipt.detail_json) == {"output": message.content}
    assert effect.receipt.provider_reference == "call_1"


def test_replaying_the_same_tool_call_returns_the_recorded_output_without_running_it(ledger, admin_ledger):
    register(admin_ledger, "email.send")
    recorder = Recorder()
    guarded = guard_tool(recorder.tool(), ledger, ledger_tool="email.send")
    thread_id = f"thread-{uuid.uuid4().hex}"
    first = last_tool_message(
        graph_with(guarded).invoke({"messages": [tool_call_message("send_email", "call_1")]}, thread(thread_id))
    )

    # A new graph (a restarted process: nothing cached) replays the same call on the same thread.
    replayed = last_tool_message(
        graph_with(guard_tool(recorder.tool(), ledger, ledger_tool="email.send")).invoke(
            {"messages": [tool_call_message("send_email", "call_1")]}, thread(thread_id)
        )
    )
    # The guarded tool invoked directly with the same thread and tool call.
    direct = guarded.invoke(
        tool_call_message("send_email", "call_1").tool_calls[0] | {"type": "tool_call"}, thread(thread_id)
    )

    assert recorder.calls == [ARGUMENTS]
    assert replayed.content == first.content == direct.content
    assert replayed.status == "success"
    # Another tool call id is another effect: it runs.
    graph_with(guarded).invoke({"messages": [tool_call_message("send_email", "call_2")]}, thread(thread_id))
    assert len(recorder.calls) == 2


def test_an_irreversible_tool_interrupts_the_graph_until_a_reviewer_approves(ledger, admin_ledger, reviewer_ledger):
    register_irreversible(admin_ledger)
    recorder = Recorder()
    app = graph_with(
        guard_tool(recorder.tool("wire_money"), ledger, ledger_tool=IRREVERSIBLE_TOOL, target="bank:acct-1")
    )
    config = thread(f"thread-{uuid.uuid4().hex}")

    paused = app.invoke({"messages": [tool_call_message("wire_money", "call_w")]}, config)
    (pending,) = paused["__interrupt__"]
    approval_id = pending.value["approval_request_id"]
    assert pending.value["type"] == "effect_ledger.approval_required" and pending.value["state"] == "PENDING"
    assert pending.value["tool"] == IRREVERSIBLE_TOOL and pending.value["arguments"] == ARGUMENTS
    assert pending.value["target"] == "bank:acct-1" and pending.value["tool_call_id"] == "call_w"
    assert recorder.calls == []

    # Resumed before any decision: the ledger still says REQUIRE_APPROVAL, so it pauses again.
    still = app.invoke(Command(resume={"approved": True}), config)
    assert still["__interrupt__"][0].value["approval_request_id"] == approval_id
    assert recorder.calls == []

    reviewer_ledger.approvals.DecideApproval(
        approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=True, comment="checked")
    )
    resumed = app.invoke(Command(resume={"approved": True}), config)

    assert "__interrupt__" not in resumed
    message = last_tool_message(resumed)
    assert message.status == "success" and recorder.calls == [ARGUMENTS]
    approval = ledger.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=approval_id))
    assert approvals_pb2.ApprovalState.Name(approval.state) == "CONSUMED"
    # Resuming the finished thread does not run it again.
    app.invoke(Command(resume={"approved": True}), config)
    assert recorder.calls == [ARGUMENTS]


def test_a_denied_approval_ends_in_an_error_message_and_the_tool_is_not_run(ledger, admin_ledger, reviewer_ledger):
    register_irreversible(admin_ledger)
    recorder = Recorder()
    app = graph_with(guard_tool(recorder.tool("wire_money"), ledger, ledger_tool=IRREVERSIBLE_TOOL))
    config = thread(f"thread-{uuid.uuid4().hex}")
    paused = app.invoke({"messages": [tool_call_message("wire_money", "call_w")]}, config)
    approval_id = paused["__interrupt__"][0].value["approval_request_id"]

    reviewer_ledger.approvals.DecideApproval(
        approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=False, comment="no")
    )
    message = last_tool_message(app.invoke(Command(resume={"approved": False}), config))

    assert message.status == "error" and approval_id in message.content and "denied" in message.content
    assert recorder.calls == []


def test_a_denied_tool_is_not_run_and_the_error_names_the_reason(ledger):
    recorder = Recorder()  # no contract registered for the tool: the policy denies TOOL_UNKNOWN
    app = graph_with(guard_tool(recorder.tool(), ledger, ledger_tool="email.unregistered"))

    state = app.invoke({"messages": [tool_call_message("send_email", "call_1")]}, thread(f"t-{uuid.uuid4().hex}"))

    message = last_tool_message(state)
    assert message.status == "error" and "TOOL_UNKNOWN" in message.content
    assert message.tool_call_id == "call_1" and recorder.calls == []


def test_a_tool_that_raises_leaves_the_effect_unknown_and_a_replay_does_not_run_it(ledger, admin_ledger):
    register(admin_ledger, "email.send")
    recorder = Recorder()
    guarded = guard_tool(recorder.tool(fails_with=TimeoutError("no answer")), ledger, ledger_tool="email.send")
    thread_id = f"thread-{uuid.uuid4().hex}"
    with pytest.raises(TimeoutError):
        graph_with(guarded).invoke({"messages": [tool_call_message("send_email", "call_1")]}, thread(thread_id))

    replayed = last_tool_message(
        graph_with(guarded).invoke({"messages": [tool_call_message("send_email", "call_1")]}, thread(thread_id))
    )

    assert replayed.status == "error" and "UNKNOWN" in replayed.content and "reconciled" in replayed.content
    assert recorder.calls == [ARGUMENTS]


def test_a_rejection_records_failed(ledger, admin_ledger):
    register(admin_ledger, "email.send")
    recorder = Recorder()
    guarded = guard_tool(recorder.tool(fails_with=Rejected("mailbox does not exist")), ledger, ledger_tool="email.send")
    thread_id = f"thread-{uuid.uuid4().hex}"
    with pytest.raises(Rejected):
        graph_with(guarded).invoke({"messages": [tool_call_message("send_email", "call_1")]}, thread(thread_id))

    run_id = run_of_thread(ledger, thread_id)
    again = ask_again(ledger, run_id, "email.send", f"{thread_id}/call_1")
    # FAILED frees the key for a new attempt: the gate allows it again.
    assert outcome(again) == "ALLOW" and again.attempt_number == 2


def test_a_custom_key_function_names_the_effect(ledger, admin_ledger):
    register(admin_ledger, "email.send")
    recorder = Recorder()
    guarded = guard_tool(
        recorder.tool(), ledger, ledger_tool="email.send", key=lambda call: f"welcome/{call.arguments['to']}"
    )
    thread_id = f"thread-{uuid.uuid4().hex}"
    graph_with(guarded).invoke({"messages": [tool_call_message("send_email", "call_1")]}, thread(thread_id))
    # Another tool call id, the same key: the same effect, not run again.
    graph_with(guarded).invoke({"messages": [tool_call_message("send_email", "call_2")]}, thread(thread_id))

    assert recorder.calls == [ARGUMENTS]
    run_id = run_of_thread(ledger, thread_id)
    assert outcome(ask_again(ledger, run_id, "email.send", "welcome/bob@example.com")) == "DUPLICATE"
