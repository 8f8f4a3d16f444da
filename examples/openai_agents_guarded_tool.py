"""An OpenAI Agents SDK function tool that the effect ledger gates, driven without a language
model (the SDK's ScriptedModel plays the model; nothing is sent to OpenAI).

Run it against a local server (from the repository root):

    bash scripts/serve.sh &                                          # 127.0.0.1:50051
    .venv/bin/pip install -e './clients/python[openai-agents]'
    export EFFECT_LEDGER_ADMIN_TOKEN=$(.venv/bin/effect-ledger principal add --tenant demo --id ops --role admin)
    export EFFECT_LEDGER_AGENT_TOKEN=$(.venv/bin/effect-ledger principal add --tenant demo --id agent --role agent)
    export EFFECT_LEDGER_REVIEWER_TOKEN=$(.venv/bin/effect-ledger principal add --tenant demo --id alice --role reviewer)
    .venv/bin/python examples/openai_agents_guarded_tool.py

(`principal add` prints the token; check that the captured value starts with `elt_`.) The script
registers `payment.wire` (IRREVERSIBLE: the shipped policy asks for an approval) as the admin.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass

from agents import Agent, RunConfig, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from effect_ledger_client import Ledger
from effect_ledger_client.adapters.openai_agents import guard_function_tool, ledger_approval_id
from effect_ledger_client.proto import approvals_pb2, common_pb2, runs_pb2, tools_pb2

TARGET = os.environ.get("EFFECT_LEDGER_TARGET", "127.0.0.1:50051")
NO_TRACING = RunConfig(tracing_disabled=True)


@dataclass
class AppContext:
    ledger_run_id: str  # where the guarded tools find their run


@function_tool
def wire_money(account: str, amount: int) -> str:
    """Wire money to an account."""
    print(f"  (wiring {amount} to {account})")
    return f"wired {amount} to {account}"


async def main() -> None:
    with Ledger(TARGET, os.environ["EFFECT_LEDGER_ADMIN_TOKEN"]) as admin:
        admin.tools.PutToolContract(
            tools_pb2.PutToolContractRequest(
                contract=tools_pb2.ToolContract(
                    tool="payment.wire",
                    effect_class=common_pb2.IRREVERSIBLE,
                    provider_idempotency=False,
                    max_attempts=1,
                    lease_seconds=60,
                )
            )
        )
    ledger = Ledger(TARGET, os.environ["EFFECT_LEDGER_AGENT_TOKEN"])
    reviewer = Ledger(TARGET, os.environ["EFFECT_LEDGER_REVIEWER_TOKEN"])
    conversation = f"demo-{uuid.uuid4().hex[:8]}"
    run = ledger.runs.CreateRun(runs_pb2.CreateRunRequest(request_id=conversation, adapter="openai-agents"))

    guarded = guard_function_tool(
        wire_money, ledger, ledger_tool="payment.wire", target=lambda a: f"bank:{a['account']}"
    )
    model = ScriptedModel(
        [
            [function_call("wire_money", {"account": "acct-1", "amount": 100}, call_id="call_1")],
            [assistant_message("Done: the money is on its way.")],
        ]
    )
    agent = Agent(name="treasurer", model=model, tools=[guarded])

    result = await Runner.run(agent, "pay acct-1", context=AppContext(run.run_id), run_config=NO_TRACING)
    (item,) = result.interruptions
    approval_id = ledger_approval_id(item, guarded)
    print("the run stopped for ledger approval", approval_id)

    reviewer.approvals.DecideApproval(
        approvals_pb2.DecideApprovalRequest(approval_id=approval_id, approve=True, comment="checked the account")
    )
    print("a reviewer approved it in the ledger; approving the interruption and resuming:")
    state = result.to_state()
    state.approve(item)
    resumed = await Runner.run(agent, state, run_config=NO_TRACING)
    print("->", resumed.final_output)
    ledger.close()
    reviewer.close()


if __name__ == "__main__":
    asyncio.run(main())
