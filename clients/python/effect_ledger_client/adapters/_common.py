"""What the framework adapters share: identifiers the ledger accepts, and a tool's output kept
as a receipt's detail."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

IDENTIFIER = re.compile(r"[\x21-\x7e]{1,256}")  # the ledger's identifiers: printable ASCII, no spaces
OUTPUT_KEPT_BYTES_MAX = 60 * 1024  # receipt detail is at most 64 KiB; larger output keeps its digest


def identifier(value: str) -> str:
    """``value`` when the ledger accepts it as an identifier, else ``sha256-<hex>`` of it."""
    if IDENTIFIER.fullmatch(value):
        return value
    return "sha256-" + hashlib.sha256(value.encode()).hexdigest()


def output_detail(output: Any) -> dict[str, Any]:
    """The receipt detail for a tool's output: the output itself when it fits, else its digest."""
    try:
        encoded = json.dumps({"output": output}, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        output = str(output)
        encoded = json.dumps({"output": output}, ensure_ascii=False)
    size = len(encoded.encode())
    if size <= OUTPUT_KEPT_BYTES_MAX:
        return {"output": output}
    return {"output_sha256": hashlib.sha256(encoded.encode()).hexdigest(), "output_bytes": size}


def replayed_output(receipt: Any) -> Any:
    """A repeated call's answer: the output kept in the receipt, or a note that it was too large."""
    detail = receipt.detail or {}
    if "output" in detail:
        return detail["output"]
    return f"effect-ledger: already done (receipt {receipt.reference}); the output was too large to keep"
