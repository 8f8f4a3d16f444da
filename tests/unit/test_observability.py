"""Request ids, failure causes, the log renderers and tracing's default (observability/),
without a server."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys

import pytest

from effect_ledger.errors import PolicyUnavailable
from effect_ledger.observability import calls, logs

# Run in a fresh interpreter: what ``serve`` gets for tracing with no flag and no variable.
TRACING_BY_DEFAULT = """
import json, sys
from effect_ledger.cli import build_parser
from effect_ledger.observability import tracing

exporter = build_parser().parse_args(["serve"]).otel_exporter
tracing.configure(exporter)
print(json.dumps({
    "exporter": exporter,
    "enabled": tracing.enabled(),
    "interceptor": repr(tracing.server_interceptor()),
    "shared_no_op_span": tracing.span("a") is tracing.span("b"),
    "opentelemetry_modules": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
}))
"""


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("abc-123", True),
        ("!" + "~" * 127, True),  # 128 visible characters: the longest kept
        ("x" * 129, False),
        ("", False),
        ("has space", False),
        ("tab\there", False),
        ("caf\u00e9", False),
    ],
)
def test_a_request_id_is_kept_only_when_short_and_visible_ascii(sent, kept):
    found = calls.request_id_of([("authorization", "Bearer t"), (calls.REQUEST_ID_KEY, sent)])
    if kept:
        assert found == sent
    else:
        assert re.fullmatch(r"[0-9a-f]{16}", found)


def test_a_call_without_a_request_id_gets_a_new_one_each_time():
    assert calls.request_id_of([]) != calls.request_id_of(None)


def test_the_cause_names_every_exception_under_the_error():
    try:
        try:
            try:
                raise ConnectionRefusedError(111, "Connect call failed ('10.0.0.9', 8181)")
            except OSError as refused:
                raise RuntimeError("Cannot connect to host 10.0.0.9:8181") from refused
        except RuntimeError as failed:
            raise PolicyUnavailable("the OPA server is unavailable") from failed
    except PolicyUnavailable as error:
        cause = logs.cause_of(error)
    assert cause == (
        "RuntimeError: Cannot connect to host 10.0.0.9:8181 <- "
        "ConnectionRefusedError: [Errno 111] Connect call failed ('10.0.0.9', 8181)"
    )
    assert logs.cause_of(PolicyUnavailable("no cause")) == ""


@pytest.fixture
def captured():
    """A stream for the test's own configuration; the root logger as it was, after."""
    stream = io.StringIO()
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    yield stream
    logs.configure("text", "INFO", stream=io.StringIO())  # clears the worker label
    root.handlers[:] = before[0]
    root.setLevel(before[1])


def test_json_lines_from_both_apis_carry_the_call_s_request_id(captured):
    logs.configure("json", "INFO", worker=1, stream=captured)
    token = calls.current.set(calls.CallState(method="m", request_id="rid-1"))
    try:
        logging.getLogger("effect_ledger.some").warning("plain %s", "line")
        logs.get_logger("effect_ledger.other").info("structured", field="value")
    finally:
        calls.current.reset(token)
    logging.getLogger("effect_ledger.some").info("outside any call")
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert [(line["logger"], line["event"], line["level"]) for line in lines] == [
        ("effect_ledger.some", "plain line", "warning"),
        ("effect_ledger.other", "structured", "info"),
        ("effect_ledger.some", "outside any call", "info"),
    ]
    assert [line.get("request_id") for line in lines] == ["rid-1", "rid-1", None]
    assert lines[1]["field"] == "value"
    assert {line["worker"] for line in lines} == {1}


def test_text_lines_keep_the_worker_label_and_quote_values_with_spaces(captured):
    logs.configure("text", "INFO", worker=0, stream=captured)
    logs.get_logger("effect_ledger.access").info("rpc", code="OK", reason="two words")
    logging.getLogger("effect_ledger.transport.workers").info("shutting down (grace %.1f s)", 1.0)
    first, second = captured.getvalue().splitlines()
    assert re.fullmatch(r"\S+ INFO \[worker 0 pid \d+\] effect_ledger\.access rpc code=OK reason=\"two words\"", first)
    assert re.fullmatch(
        r"\S+ INFO \[worker 0 pid \d+\] effect_ledger\.transport\.workers shutting down \(grace 1\.0 s\)", second
    )


def test_an_unknown_format_or_level_is_refused():
    with pytest.raises(logs.BadLogSetting):
        logs.check_settings("xml", "INFO")
    with pytest.raises(logs.BadLogSetting):
        logs.check_settings("json", "LOUD")


def test_a_list_in_a_text_line_is_its_items_joined_by_commas(captured):
    logs.configure("text", "INFO", stream=captured)
    logs.get_logger("effect_ledger.access").info("rpc", outcome="DENY", reasons=["TOOL_RETIRED", "BUDGET_EXHAUSTED"])
    (line,) = captured.getvalue().splitlines()
    assert line.endswith(" effect_ledger.access rpc outcome=DENY reasons=TOOL_RETIRED,BUDGET_EXHAUSTED"), line


def test_tracing_is_off_unless_an_exporter_is_configured():
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("EFFECT_LEDGER_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", TRACING_BY_DEFAULT], env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "exporter": "none",
        "enabled": False,
        "interceptor": "None",  # the gRPC server gets the guard alone
        "shared_no_op_span": True,
        "opentelemetry_modules": [],  # not even imported
    }
