"""The OpenAI Agents SDK adapter against a real server, on PostgreSQL and on SQLite: the guarded
FunctionTool invoked directly, and a run driven by the SDK's scripted model (no model, no
network) through the SDK's own approval interruptions."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass

from agents import Agent, RunConfig, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from effect_ledger_client import Rejected
from effect_ledger_client.adapters.openai_agents import guard_function_tool, ledger_approval_id
from effect_ledger_client.proto import approvals_pb2, common_pb2, gate_pb2

from .conftest import IRREVERSIBLE_TOOL, register, register_irreversible

ARGUMENTS = {"to": "bob@example.com", "subject": "hello"}
NO_TRACING = RunConfig(tracing_disabled=True)


@dataclass
class AppContext:
    ledger_run_id: str


class Recorder:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def tool(self, name: str = "send_email", fails_with: BaseException | None = None, **options):
        @function_tool(name_override=name, **options)
        def send_email(to: str, subject: str) -> str:
            """Send an email."""
            self.calls.append({"to": to, "subject": subject})
            if fails_with is not None:
                raise fails_with
            return f"sent {subject!r} to {to} (#{len(self.calls)})"

        return send_email


def invoke(tool, run_id: str, call_id: str, arguments: dict = ARGUMENTS):
    """The SDK's own way of calling a tool: on_invoke_tool(ToolContext, arguments JSON)."""
    text = json.dumps(arguments)
    context = ToolContext(AppContext(run_id), tool_name=tool.name, tool_call_id=call_id, tool_arguments=text)
    return asyncio.run(tool.on_invoke_tool(context, text))


def needs_approval(tool, run_id: str, call_id: str, arguments: dict = ARGUMENTS) -> bool:
    from agents import RunContextWrapper

    return asyncio.run(tool.needs_approval(RunContextWrapper(AppContext(run_id)), arguments, call_id))


def authorize(ledger, run_id: str, tool: str, key: str, arguments: dict = ARGUMENTS, target: str = ""):
    return ledger.gate.AuthorizeEffect(
        gate_pb2.AuthorizeEffectRequest(
            run_id=run_id,
            tool=tool,
            idempotency_key=key,
            target=target or tool,
            arguments_json=json.dumps(arguments).encode(),
        )
    )


def outcome(response) -> str:
    return common_pb2.Outcome.Name(response.outcome)


def test_an_allowed_call_runs_once_and_its_effect_succeeds(ledger, admin_ledger, run_id):
    register(admin_ledger, "email.send")
    recorder = Recorder()
    guarded = guard_function_tool(recorder.tool(), ledger, ledger_tool="email.send")

    output = invoke(guarded, run_id, "call_1")

    assert output == "sent 'hello' to bob@example.com (#1)" and recorder.calls == [ARGUMENTS]
    again = authorize(ledger, run_id, "email.send", f"{run_id}/call_1")
    assert outcome(again) == "DUPLICATE"
    effect = ledger.gate.GetEffect(gate_pb2.GetEffectRequest(effect_id=again.effect_id))
    assert common_pb2.Stage.Name(effect.stage) == "SUCCEEDED"
    assert effect.receipt.provider_reference == "call_1" and json.loads(effect.receipt.detail_json) == {
        "output": output
    }


def test_the_same_call_id_again_returns_the_recorded_output_without_running(ledger, admin_ledger, run_id):
    register(admin_ledger, "email.send")
    recorder = Recorder()
    guarded = guard_function_tool(recorder.tool(), ledger, ledger_tool="email.send")
    first = invoke(guarded, run_id, "call_1")
    # A fresh wrapper (a restarted process) and the same call id: the same effect.
    again = invoke(guard_function_tool(recorder.tool(), ledger, ledger_tool="email.send"), run_id, "call_1")

    assert again == first and recorder.calls == [ARGUMENTS]
    invoke(guarded, run_id, "call_2")
    assert len(recorder.calls) == 2


def test_a_denied_call_is_not_run_and_the_text_names_the_reason(ledger, run_id):
    recorder = Recorder()  # no contract for the tool: the policy denies TOOL_UNKNOWN
    guarded = guard_function_tool(recorder.tool(), ledger, ledger_tool="email.unregistered")

    output = invoke(guarded, run_id, "call_1")

    assert "denied" in output and "TOOL_UNKNOWN" in output and recorder.calls == []
    assert needs_approval(guarded, run_id, "call_1") is False


def test_a_call_needing_approval_is_not_run_and_the_text_names_the_request(ledger, admin_ledger, run_id):
    register_irreversible(admin_ledger)
    recorder = Recorder()
    guarded = guard_function_tool(recorder.tool("wire_money"), ledger, ledger_tool=IRREVERSIBLE_TOOL)

    assert needs_approval(guarded, run_id, "call_w") is True
    output = invoke(guarded, run_id, "call_w")

    request = authorize(ledger, run_id, IRREVERSIBLE_TOOL, f"{run_id}/call_w")
    assert outcome(request) == "REQUIRE_APPROVAL" and request.approval_request_id in output
    assert "pending" in output and recorder.calls == []


def test_an_allowed_call_asked_before_it_runs_is_released_and_runs_once(ledger, admin_ledger, run_id):
    register(admin_ledger, "email.send")
    recorder = Recorder()
    guarded = guard_function_tool(recorder.tool(), ledger, ledger_tool="email.send")

    assert needs_approval(guarded, run_id, "call_1") is False
    invoke(guarded, run_id, "call_1")

    effect = ledger.gate.GetEffect(
        gate_pb2.GetEffectRequest(effect_id=authorize(ledger, run_id, "email.send", f"{run_id}/call_1").effect_id)
    )
    stages = [common_pb2.Stage.Name(attempt.stage) for attempt in effect.attempts]
    assert sorted(stages) == ["RELEASED", "SUCCEEDED"] and recorder.calls == [ARGUMENTS]


def test_a_raising_tool_leaves_the_effect_unknown_and_is_not_run_again(ledger, admin_ledger, run_id):
    register(admin_ledger, "email.send")
    recorder = Recorder()
    guarded = guard_function_tool(recorder.tool(fails_with=TimeoutError("no answer")), ledger, ledger_tool="email.send")

    first = invoke(guarded, run_id, "call_1")  # the SDK's default failure text for the model
    again = invoke(guarded, run_id, "call_1")

    assert "error occurred" in first
    assert "UNKNOWN" in again and "reconciled" in again and recorder.calls == [ARGUMENTS]


def test_a_rejection_records_failed(ledger, admin_ledger, run_id):
    register(admin_ledger, "email.send")
    recorder = Recorder()
    guarded = guard_function_tool(
        recorder.tool(fails_with=Rejected("no such mailbox")), ledger, ledger_tool="email.send"
    )
    invoke(guarded, run_id, "call_1")

    again = authorize(ledger, run_id, "email.send", f"{run_id}/call_1")
    assert outcome(again) == "ALLOW" and again.attempt_number == 2  # FAILED frees the key


def scripted_agent(tool, call_id: str) -> Agent:
    model = ScriptedModel(
        [
            [function_call(tool.name, ARGUMENTS, call_id=call_id)],
            [assistant_message("done")],
        ]
    )
    return Agent(name="mailer", model=model, tools=[tool])


def test_the_sdk_run_interrupts_for_the_ledger_approval_and_runs_once_approved(
    ledger, admin_ledger, reviewer_ledger, run_id
):
    register_irreversible(admin_ledger)
    recorder = Recorder()
    guarded = guard_function_tool(recorder.tool("wire_money"), ledger, ledger_tool=IRREVERSIBLE_TOOL)
    agent = scripted_agent(guarded, f"call_{uuid.uuid4().hex[:8]}")

    async def scenario():
        result = await Runner.run(agent, "wire it", context=AppContext(run_id), run_config=NO_TRACING)
        (item,) = result.interruptions
        approval_id = ledger_approval_id(item, guarded)
        assert approval_id and recorder.calls == []
        approval = ledger.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=approval_id))
        assert approvals_pb2.ApprovalState.Name(approval.state) == "PENDING" and approval.tool == IRREVERSIBLE_TOOL

        reviewer_ledger.approvals.DecideApproval(
            approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=True, comment="checked")
        )
        state = result.to_state()
        state.approve(item)
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)
        return approval_id, resumed

    approval_id, resumed = asyncio.run(scenario())

    assert resumed.final_output == "done" and not resumed.interruptions
    assert recorder.calls == [ARGUMENTS]
    approval = ledger.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=approval_id))
    assert approvals_pb2.ApprovalState.Name(approval.state) == "CONSUMED"


def test_approving_in_the_sdk_alone_does_not_run_a_call_the_ledger_has_not_approved(ledger, admin_ledger, run_id):
    register_irreversible(admin_ledger)
    recorder = Recorder()
    guarded = guard_function_tool(recorder.tool("wire_money"), ledger, ledger_tool=IRREVERSIBLE_TOOL)
    agent = scripted_agent(guarded, "call_w")

    async def scenario():
        result = await Runner.run(agent, "wire it", context=AppContext(run_id), run_config=NO_TRACING)
        (item,) = result.interruptions
        state = result.to_state()
        state.approve(item)
        resumed = await Runner.run(agent, state, run_config=NO_TRACING)
        return ledger_approval_id(item, guarded), resumed

    approval_id, resumed = asyncio.run(scenario())

    outputs = [item.output for item in resumed.new_items if getattr(item, "type", "") == "tool_call_output_item"]
    assert recorder.calls == [] and len(outputs) == 1 and approval_id in outputs[0] and "pending" in outputs[0]
