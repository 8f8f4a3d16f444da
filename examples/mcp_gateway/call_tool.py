"""Call one tool through the gateway, as an MCP host would, and print what it answers.

    python call_tool.py                      # list the gateway's tools
    python call_tool.py send_email '{"to": "bob@example.com", "subject": "Hi", "body": "Hello"}'

Starts `python -m effect_ledger_client.adapters.mcp_gateway --config gateway.toml` (this
folder's, or the file EFFECT_LEDGER_GATEWAY_CONFIG names) as a subprocess over stdio, passing it
EFFECT_LEDGER_TOKEN from the environment.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

HERE = Path(__file__).resolve().parent
CONFIG = Path(os.environ.get("EFFECT_LEDGER_GATEWAY_CONFIG", HERE / "gateway.toml")).resolve()


async def main(arguments: list[str]) -> int:
    gateway = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "effect_ledger_client.adapters.mcp_gateway",
            "--config",
            str(CONFIG),
        ],
        env={"EFFECT_LEDGER_TOKEN": os.environ.get("EFFECT_LEDGER_TOKEN", "")},
        cwd=str(HERE),
    )
    async with stdio_client(gateway) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        if not arguments:
            for tool in (await session.list_tools()).tools:
                print(f"{tool.name}: {tool.description}")
            return 0
        name, tool_arguments = arguments[0], json.loads(arguments[1]) if len(arguments) > 1 else {}
        result = await session.call_tool(name, tool_arguments)
        print(
            "error:" if result.is_error else "result:",
            *(block.text for block in result.content if block.type == "text"),
        )
        print("_meta:", json.dumps(result.meta or {}, indent=2))
        return 1 if result.is_error else 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1:]))
