"""Strict JSON in, RFC 8785 canonical JSON and SHA-256 digests out.

Client JSON is parsed strictly, so that two byte strings the service accepts as "the same
arguments" always canonicalize to the same digest, and anything ambiguous is refused:

- invalid UTF-8, a byte-order mark, trailing garbage, NaN/Infinity: refused;
- duplicate object keys: refused (which value would be meant?);
- a number whose decimal text does not survive the trip through an IEEE double (such as
  12345678901234567891 or 0.1000000000000000000001): refused, because RFC 8785 serializes
  numbers as doubles and the digest would silently cover a different value. Integers beyond
  2^53 that a double holds exactly (2^60) are kept as that double.
- nesting deeper than ``depth_max`` and payloads over ``size_max_bytes``: refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from decimal import Decimal
from typing import Any

import rfc8785

from effect_ledger.errors import InvalidArgument

SAFE_INTEGER_MAX = 2**53 - 1
DEPTH_MAX = 32
_SURROGATE = re.compile("[\ud800-\udfff]")
# Text decoded strictly from UTF-8 holds no surrogate; a parsed value holds one only from a
# ``\ud800``-``\udfff`` escape (a valid pair becomes one code point). Without such an escape in
# the text (searched at C speed) the value need not be walked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _Refused(ValueError):
    """Raised inside the JSON decoder hooks; becomes InvalidArgument at the boundary."""


def _reject_constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


def _as_double(text: str) -> float:
    """The double a JSON number denotes, if the text survives the trip through one.

    Accepted: the text is the double's shortest round-trip form (0.1) or its exact value
    (1152921504606846976 = 2**60). Refused: anything a double would silently change.
    """
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is out of a double's range")
    exact = Decimal(text)
    if exact != Decimal(repr(value)) and exact != Decimal(value):
        raise _Refused(f"the number {text[:40]} cannot be held exactly by a double")
    return value


def _parse_int(text: str) -> int | float:
    if len(text.lstrip("-")) > len(str(SAFE_INTEGER_MAX)):
        # Beyond the safe range for sure; int() would also refuse texts over 4300 digits
        # with a plain ValueError (sys.get_int_max_str_digits), which is no client error.
        return _as_double(text)
    value = int(text)
    if -SAFE_INTEGER_MAX <= value <= SAFE_INTEGER_MAX:
        return value
    return _as_double(text)


def _parse_float(text: str) -> float:
    return _as_double(text)


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Refused(f"duplicate key {key[:40]!r}")
        result[key] = value
    return result


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object_without_duplicates,
    parse_int=_parse_int,
    parse_float=_parse_float,
    parse_constant=_reject_constant,
)


def _depth(value: Any) -> int:
    """Nesting depth, computed without recursion (only objects and arrays nest: a number or
    string inside the innermost one adds no level, and only containers are visited)."""
    if type(value) is not dict and type(value) is not list:
        return 0
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if level > deepest:
            deepest = level
        deeper = level + 1
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, deeper))
    return deepest


def _has_lone_surrogate(value: Any) -> bool:
    """True when a string or key holds a lone surrogate (a ``\\ud800`` escape): not Unicode text."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_json(
    raw: bytes,
    *,
    field: str,
    size_max_bytes: int,
    require_object: bool = True,
    allow_empty: bool = False,
) -> Any:
    """Parse client JSON strictly; raise InvalidArgument naming ``field`` on any refusal."""
    if len(raw) == 0:
        if allow_empty:
            return None
        raise InvalidArgument.field(field, "is required", reason="JSON_REQUIRED")
    if len(raw) > size_max_bytes:
        raise InvalidArgument.field(
            field, f"is {len(raw)} bytes; at most {size_max_bytes} allowed", reason="JSON_TOO_LARGE"
        )
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as error:
        raise InvalidArgument.field(
            field, f"is not valid UTF-8 (byte {error.start})", reason="JSON_INVALID_UTF8"
        ) from None
    try:
        value, end = _DECODER.raw_decode(text.strip(" \t\r\n"))
        if end != len(text.strip(" \t\r\n")):
            raise _Refused("extra data after the JSON value")
    except _Refused as error:
        raise InvalidArgument.field(field, str(error), reason="JSON_INVALID") from None
    except (json.JSONDecodeError, RecursionError) as error:
        raise InvalidArgument.field(field, f"is not JSON: {error}", reason="JSON_INVALID") from None
    if require_object and not isinstance(value, dict):
        raise InvalidArgument.field(field, "must be a JSON object", reason="JSON_NOT_OBJECT")
    if _depth(value) > DEPTH_MAX:
        raise InvalidArgument.field(field, f"nests deeper than {DEPTH_MAX} levels", reason="JSON_TOO_DEEP")
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        # RFC 8785 cannot serialize it (and it has no UTF-8 form): refuse it here, not later.
        raise InvalidArgument.field(
            field,
            "holds an unpaired surrogate escape, which is not Unicode text",
            reason="JSON_INVALID",
        )
    return value


def _mark_large_integers(value: Any, nonce: str, found: list[int]) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not -SAFE_INTEGER_MAX <= value <= SAFE_INTEGER_MAX:
        found.append(value)
        return f"\u0000{nonce}:{value}"
    if isinstance(value, dict):
        return {key: _mark_large_integers(item, nonce, found) for key, item in value.items()}
    if isinstance(value, list):
        return [_mark_large_integers(item, nonce, found) for item in value]
    return value


def _without_floats_or_wide_keys(value: Any) -> bool:
    """True when the standard library writes ``value`` exactly as RFC 8785 does: no float
    anywhere (JCS writes numbers as ECMAScript does), only ASCII object keys (JCS sorts keys by
    UTF-16 code units, Python by code points; for ASCII the orders agree), and nothing but
    dicts, lists, strings, integers, booleans and null. String escaping agrees: both escape
    ``"``, ``\\`` and the control characters below U+0020, with the short forms \\b \\t \\n \\f
    \\r and otherwise \\u00xx in lower-case hex, and nothing else (``ensure_ascii=False``)."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if kind is dict:
            for key in item:
                if type(key) is not str or not key.isascii():
                    return False
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        else:
            return False
    return True


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 (JCS) canonical form of a value accepted by parse_json or built by the service.

    One extension: an integer beyond +-(2**53 - 1), which JCS cannot express, is written as its
    exact decimal literal. Client JSON never holds one (parse_json turns it into a double or
    refuses it); only the service's own 64-bit amounts (budgets, usage) can.

    Values without floats and with ASCII keys (nearly all: ids, stages, amounts) are written by
    the standard library's C encoder, which gives the same bytes (see the property test in
    tests/unit/test_canonical.py); anything else goes through the ``rfc8785`` package.
    """
    if _without_floats_or_wide_keys(value):
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        nonce = os.urandom(8).hex()
        found: list[int] = []
        text = rfc8785.dumps(_mark_large_integers(value, nonce, found))
        for number in found:
            text = text.replace(f'"\\u0000{nonce}:{number}"'.encode(), str(number).encode())
        return text


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    return sha256_hex(canonical_bytes(value))


def intent_digest(*, tool: str, tool_revision: int, target: str, arguments: dict[str, Any]) -> str:
    """The identity of an intended effect: what runs where with which arguments, under which contract."""
    return digest({"tool": tool, "tool_revision": tool_revision, "target": target, "arguments": arguments})


def receipt_digest(*, provider_reference: str, detail: Any) -> str:
    return digest({"provider_reference": provider_reference, "detail": detail})
