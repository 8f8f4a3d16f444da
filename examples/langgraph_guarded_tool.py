"""A LangGraph tool node whose tools the effect ledger gates, driven without a language model.

Run it against a local server (from the repository root):

    bash scripts/serve.sh &                                          # 127.0.0.1:50051
    .venv/bin/pip install -e './clients/python[langgraph]'
    export EFFECT_LEDGER_ADMIN_TOKEN=$(.venv/bin/effect-ledger principal add --tenant demo --id ops --role admin)
    export EFFECT_LEDGER_AGENT_TOKEN=$(.venv/bin/effect-ledger principal add --tenant demo --id agent --role agent)
    export EFFECT_LEDGER_REVIEWER_TOKEN=$(.venv/bin/effect-ledger principal add --tenant demo --id alice --role reviewer)
    .venv/bin/python examples/langgraph_guarded_tool.py

(`principal add` prints the token; check that the captured value starts with `elt_`.) The script
registers the two contracts itself (as the admin): `email.send` (retryable with a key) and
`payment.wire` (IRREVERSIBLE: the shipped policy asks for an approval). A model would put the tool
calls in an AIMessage; here the script writes that message itself.
"""

from __future__ import annotations

import os
import uuid

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from effect_ledger_client import Ledger
from effect_ledger_client.adapters.langgraph import guard_tools
from effect_ledger_client.proto import approvals_pb2, common_pb2, tools_pb2

TARGET = os.environ.get("EFFECT_LEDGER_TARGET", "127.0.0.1:50051")


@tool
def send_email(to: str, subject: str) -> str:
    """Send an email."""
    print(f"  (sending {subject!r} to {to})")
    return f"queued {subject!r} for {to}"


@tool
def wire_money(account: str, amount: int) -> str:
    """Wire money to an account."""
    print(f"  (wiring {amount} to {account})")
    return f"wired {amount} to {account}"


def register_contracts(admin: Ledger) -> None:
    for contract in (
        tools_pb2.ToolContract(
            tool="email.send",
            effect_class=common_pb2.RETRYABLE_WITH_KEY,
            provider_idempotency=True,
            max_attempts=3,
            lease_seconds=60,
        ),
        tools_pb2.ToolContract(
            tool="payment.wire",
            effect_class=common_pb2.IRREVERSIBLE,
            provider_idempotency=False,
            max_attempts=1,
            lease_seconds=60,
        ),
    ):
        admin.tools.PutToolContract(tools_pb2.PutToolContractRequest(contract=contract))


def call(name: str, call_id: str, **arguments) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": arguments, "id": call_id, "type": "tool_call"}])


def main() -> None:
    with Ledger(TARGET, os.environ["EFFECT_LEDGER_ADMIN_TOKEN"]) as admin:
        register_contracts(admin)
    agent = Ledger(TARGET, os.environ["EFFECT_LEDGER_AGENT_TOKEN"])
    reviewer = Ledger(TARGET, os.environ["EFFECT_LEDGER_REVIEWER_TOKEN"])

    tools = guard_tools(
        [send_email, wire_money], agent, ledger_tool={"send_email": "email.send", "wire_money": "payment.wire"}
    )
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    app = graph.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"demo-{uuid.uuid4().hex[:8]}"}}  # the thread is the run

    print("1. an allowed tool call runs once:")
    state = app.invoke({"messages": [call("send_email", "call_1", to="bob@example.com", subject="hi")]}, config)
    print("  ->", state["messages"][-1].content)
    print("2. the same tool call again is not run again:")
    state = app.invoke({"messages": [call("send_email", "call_1", to="bob@example.com", subject="hi")]}, config)
    print("  ->", state["messages"][-1].content)

    print("3. an irreversible tool pauses the graph for an approval:")
    state = app.invoke({"messages": [call("wire_money", "call_2", account="acct-1", amount=100)]}, config)
    request = state["__interrupt__"][0].value
    print("  -> interrupted:", request["approval_request_id"], request["state"])
    reviewer.approvals.DecideApproval(
        approvals_pb2.DecideApprovalRequest(
            approval_id=request["approval_request_id"], approve=True, comment="checked the account"
        )
    )
    print("  a reviewer approved it; resuming:")
    state = app.invoke(Command(resume={"approved": True}), config)
    print("  ->", state["messages"][-1].content)

    print("4. a tool without a contract is denied and does not run:")
    unknown = guard_tools([send_email], agent, ledger_tool={"send_email": "email.unregistered"})
    denied = unknown[0].invoke(
        call("send_email", "call_3", to="eve@example.com", subject="x").tool_calls[0] | {"type": "tool_call"}, config
    )
    print("  ->", denied.status, denied.content)
    agent.close()
    reviewer.close()


if __name__ == "__main__":
    main()
