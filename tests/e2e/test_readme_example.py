"""The README's worked example runs as written against a real server (tokens and port swapped in)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_worked_example_runs(server, tenant):
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    tenant.add("ops", "admin")
    tenant.add("mailer-agent", "agent")
    code = (
        block.replace("127.0.0.1:50051", server.target)
        .replace("elt_...ops token...", tenant.tokens["ops"])
        .replace("elt_...mailer-agent token...", tenant.tokens["mailer-agent"])
        .replace('request_id="ticket-4711"', f'request_id="ticket-4711-{tenant.name}"')
    )
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README
    from effectledger.v1 import common_pb2

    assert namespace["decision"].outcome == common_pb2.ALLOW
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(code, str(README), "exec"), namespace)  # the same run and key again
    assert namespace["decision"].outcome == common_pb2.DUPLICATE
    assert "already sent: msg-8841" in printed.getvalue()
