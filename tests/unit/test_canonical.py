"""Strict JSON parsing, RFC 8785 canonical form and the intent digest (domain/canonical.py)."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effect_ledger.domain.canonical import (
    DEPTH_MAX,
    SAFE_INTEGER_MAX,
    canonical_bytes,
    intent_digest,
    parse_json,
    receipt_digest,
)
from effect_ledger.errors import FieldViolation, InvalidArgument

FIELD = "arguments_json"
SIZE_MAX_BYTES = 64 * 1024


def parse(raw: bytes, **options):
    options.setdefault("size_max_bytes", SIZE_MAX_BYTES)
    return parse_json(raw, field=FIELD, **options)


def digest_of(raw: bytes) -> str:
    return intent_digest(tool="email.send", tool_revision=3, target="mailto:bob@example.com", arguments=parse(raw))


# --- any serialization of the same object gives the same digest -------------------------------

keys = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=8)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE_INTEGER_MAX, max_value=SAFE_INTEGER_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=24,
)
json_objects = st.dictionaries(keys, json_values, max_size=6)
WHITESPACE = [" ", "\t", "\r", "\n"]


def render(value, rng: random.Random) -> str:
    """JSON text for ``value`` with shuffled keys, random whitespace and random escaping."""

    def gap() -> str:
        return "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(0, 2)))

    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        members = [f"{gap()}{render(k, rng)}{gap()}:{gap()}{render(v, rng)}{gap()}" for k, v in items]
        return "{" + ",".join(members) + gap() + "}"
    if isinstance(value, list):
        return "[" + ",".join(f"{gap()}{render(v, rng)}{gap()}" for v in value) + gap() + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=rng.choice([True, False]))
    return json.dumps(value)


@given(value=json_objects, seed_one=st.integers(), seed_two=st.integers())
def test_key_order_whitespace_and_escaping_do_not_change_the_digest(value, seed_one, seed_two):
    first = render(value, random.Random(seed_one)).encode("utf-8")
    second = render(value, random.Random(seed_two)).encode("utf-8")
    assert parse(first) == parse(second) == value
    assert canonical_bytes(parse(first)) == canonical_bytes(parse(second))
    assert digest_of(first) == digest_of(second)


@given(value=json_objects, seed=st.integers())
def test_the_canonical_form_parses_back_to_itself(value, seed):
    canonical = canonical_bytes(parse(render(value, random.Random(seed)).encode("utf-8")))
    assert canonical_bytes(parse(canonical)) == canonical


@pytest.mark.parametrize("spelling", [b"1", b"1.0", b"1e0", b"10E-1", b"1.000", b"0.1e1"])
def test_spellings_of_the_same_number_have_one_digest(spelling):
    assert digest_of(b'{"n":' + spelling + b"}") == digest_of(b'{"n":1}')
    assert canonical_bytes(parse(b'{"n":' + spelling + b"}")) == b'{"n":1}'


def test_intent_digest_binds_every_part_of_the_intent():
    base = {
        "tool": "email.send",
        "tool_revision": 3,
        "target": "mailto:bob@example.com",
        "arguments": {"a": 1},
    }
    digests = {
        intent_digest(**base),
        intent_digest(**{**base, "tool": "email.sent"}),
        intent_digest(**{**base, "tool_revision": 4}),
        intent_digest(**{**base, "target": "mailto:eve@example.com"}),
        intent_digest(**{**base, "arguments": {"a": 2}}),
        intent_digest(**{**base, "arguments": {"a": 1, "b": None}}),
    }
    assert len(digests) == 6


# --- the digest is SHA-256 over RFC 8785 --------------------------------------------------------


def test_canonical_form_follows_rfc_8785():
    # Key order by UTF-16 code units (RFC 8785 section 3.2.3): the emoji (a surrogate pair,
    # 0xD83D...) sorts before U+FB33 although its code point is higher.
    raw = (
        b'{"\\u20ac":"Euro Sign","\\r":"Carriage Return","\\ufb33":"Dalet","1":"One",'
        b'"\\ud83d\\ude00":"Emoji","\\u0080":"Control","\\u00f6":"o umlaut",'
        b'"numbers":[1E30,4.50,2e-3,0.000000000000000000000000001,-0.0,1e21,1e-7],'
        b'"string":"\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        b'"literals":[null,true,false]}'
    )
    expected = (
        '{"\\r":"Carriage Return","1":"One","literals":[null,true,false],'
        '"numbers":[1e+30,4.5,0.002,1e-27,0,1e+21,1e-7],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/",'
        '"\u0080":"Control","\u00f6":"o umlaut","\u20ac":"Euro Sign",'
        '"\U0001f600":"Emoji","\ufb33":"Dalet"}'
    ).encode("utf-8")
    assert canonical_bytes(parse(raw)) == expected


def test_intent_digest_is_sha256_of_the_canonical_intent():
    arguments = parse(b'{ "subject": "hi", "to": "bob@example.com", "n": 2.50 }')
    canonical = (
        b'{"arguments":{"n":2.5,"subject":"hi","to":"bob@example.com"},'
        b'"target":"mailto:bob@example.com","tool":"email.send","tool_revision":3}'
    )
    assert (
        intent_digest(tool="email.send", tool_revision=3, target="mailto:bob@example.com", arguments=arguments)
        == hashlib.sha256(canonical).hexdigest()
    )


def test_receipt_digest_is_sha256_of_the_canonical_receipt():
    expected = hashlib.sha256(b'{"detail":{"a":1,"b":[true]},"provider_reference":"msg-1"}').hexdigest()
    assert receipt_digest(provider_reference="msg-1", detail={"b": [True], "a": 1}) == expected


# --- numbers a double holds, and numbers it does not ------------------------------------------


def test_an_integer_beyond_2_53_that_a_double_holds_is_kept_as_that_double():
    value = parse(b'{"n":1152921504606846976}')  # 2**60
    assert value == {"n": float(2**60)}
    # RFC 8785 writes the double in its shortest form; both spellings denote the same double.
    assert canonical_bytes(value) == b'{"n":1152921504606847000}'
    assert digest_of(b'{"n":1152921504606846976}') == digest_of(b'{"n":1152921504606847000}')
    assert parse(b'{"n":-1152921504606846976}') == {"n": -float(2**60)}


def test_safe_integers_stay_integers_up_to_the_boundary():
    assert parse(b'{"n":9007199254740991}') == {"n": 9007199254740991}
    assert isinstance(parse(b'{"n":-9007199254740991}')["n"], int)
    assert parse(b'{"n":9007199254740992}') == {"n": 2.0**53}  # 2**53: exactly a double


def test_decimals_a_double_holds_are_accepted():
    assert parse(b'{"a":0.1,"b":-2.5e-3,"c":1e300}') == {"a": 0.1, "b": -0.0025, "c": 1e300}


# --- refusals -----------------------------------------------------------------------------------


def nested_objects(levels: int) -> bytes:
    """``levels`` objects inside each other, the innermost holding a number."""
    return b'{"a":' * (levels - 1) + b'{"leaf":1}' + b"}" * (levels - 1)


REFUSALS = [
    # (id, raw, reason, part of the description)
    ("duplicate key", b'{"a":1,"a":1}', "JSON_INVALID", "duplicate key 'a'"),
    ("nested duplicate key", b'{"a":{"b":1,"c":2,"b":3}}', "JSON_INVALID", "duplicate key 'b'"),
    ("duplicate key in an array", b'{"a":[{"c":1,"c":1}]}', "JSON_INVALID", "duplicate key 'c'"),
    ("2**53 + 1", b'{"n":9007199254740993}', "JSON_INVALID", "cannot be held exactly by a double"),
    (
        "-(2**53 + 1)",
        b'{"n":-9007199254740993}',
        "JSON_INVALID",
        "cannot be held exactly by a double",
    ),
    (
        "20 digits",
        b'{"n":12345678901234567891}',
        "JSON_INVALID",
        "cannot be held exactly by a double",
    ),
    (
        "nested big integer",
        b'{"a":[1,{"n":12345678901234567891}]}',
        "JSON_INVALID",
        "cannot be held exactly",
    ),
    (
        "lossy decimal",
        b'{"n":0.1000000000000000000001}',
        "JSON_INVALID",
        "cannot be held exactly by a double",
    ),
    (
        "lossy decimal 1.0...1",
        b'{"n":1.00000000000000000001}',
        "JSON_INVALID",
        "cannot be held exactly",
    ),
    ("underflow", b'{"n":2e-400}', "JSON_INVALID", "cannot be held exactly by a double"),
    ("overflow", b'{"n":1e400}', "JSON_INVALID", "out of a double's range"),
    (
        "5000-digit integer",
        b'{"n":' + b"7" * 5000 + b"}",
        "JSON_INVALID",
        "out of a double's range",
    ),
    ("NaN", b'{"n":NaN}', "JSON_INVALID", "NaN is not JSON"),
    ("Infinity", b'{"n":Infinity}', "JSON_INVALID", "Infinity is not JSON"),
    ("-Infinity", b'{"n":-Infinity}', "JSON_INVALID", "-Infinity is not JSON"),
    ("invalid UTF-8", b'{"a":"\xff"}', "JSON_INVALID_UTF8", "is not valid UTF-8 (byte 6)"),
    ("overlong UTF-8", b'{"a":"\xc0\xaf"}', "JSON_INVALID_UTF8", "is not valid UTF-8"),
    ("UTF-8 encoded surrogate", b'{"a":"\xed\xa0\x80"}', "JSON_INVALID_UTF8", "is not valid UTF-8"),
    ("lone surrogate escape", b'{"a":"\\ud800"}', "JSON_INVALID", "unpaired surrogate"),
    ("lone surrogate key", b'{"\\udc00":1}', "JSON_INVALID", "unpaired surrogate"),
    ("byte-order mark", b'\xef\xbb\xbf{"a":1}', "JSON_INVALID", "is not JSON"),
    ("trailing garbage", b'{"a":1} x', "JSON_INVALID", "extra data after the JSON value"),
    ("two values", b'{"a":1}{"b":2}', "JSON_INVALID", "extra data after the JSON value"),
    ("trailing comma", b'{"a":1,}', "JSON_INVALID", "is not JSON"),
    ("raw control character", b'{"a":"\x01"}', "JSON_INVALID", "is not JSON"),
    ("single quotes", b"{'a':1}", "JSON_INVALID", "is not JSON"),
    ("array", b"[1,2]", "JSON_NOT_OBJECT", "must be a JSON object"),
    ("string", b'"a"', "JSON_NOT_OBJECT", "must be a JSON object"),
    ("number", b"1", "JSON_NOT_OBJECT", "must be a JSON object"),
    ("null", b"null", "JSON_NOT_OBJECT", "must be a JSON object"),
    (
        "too deep",
        nested_objects(DEPTH_MAX + 1),
        "JSON_TOO_DEEP",
        f"nests deeper than {DEPTH_MAX} levels",
    ),
    (
        "too deep in arrays",
        b'{"a":' + b"[" * DEPTH_MAX + b"]" * DEPTH_MAX + b"}",
        "JSON_TOO_DEEP",
        "nests deeper",
    ),
    ("empty", b"", "JSON_REQUIRED", "is required"),
]


@pytest.mark.parametrize(
    ("raw", "reason", "description"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_refusals_name_the_field_and_the_reason(raw, reason, description):
    with pytest.raises(InvalidArgument) as caught:
        parse(raw)
    error = caught.value
    assert error.reason == reason
    assert len(error.violations) == 1
    violation = error.violations[0]
    assert isinstance(violation, FieldViolation)
    assert violation.field == FIELD
    assert description in violation.description
    assert error.message.startswith(f"{FIELD}: ")


def test_nesting_far_past_the_recursion_limit_is_a_refusal_not_a_crash():
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(InvalidArgument) as caught:
        parse(b'{"a":' + deep + b"}", size_max_bytes=len(deep) + 10)
    assert caught.value.reason == "JSON_INVALID"
    assert caught.value.violations[0].field == FIELD


def test_nesting_up_to_depth_max_is_accepted():
    value = parse(nested_objects(DEPTH_MAX))
    for _ in range(DEPTH_MAX - 1):
        value = value["a"]
    assert value == {"leaf": 1}
    assert parse(b'{"a":' + b"[" * (DEPTH_MAX - 1) + b"]" * (DEPTH_MAX - 1) + b"}")["a"]


def test_payload_size_is_limited_with_the_boundary_accepted():
    raw = b'{"a":"' + b"x" * 100 + b'"}'
    assert parse(raw, size_max_bytes=len(raw)) == {"a": "x" * 100}
    with pytest.raises(InvalidArgument) as caught:
        parse(raw, size_max_bytes=len(raw) - 1)
    assert caught.value.reason == "JSON_TOO_LARGE"
    assert caught.value.violations == [FieldViolation(FIELD, f"is {len(raw)} bytes; at most {len(raw) - 1} allowed")]


def test_the_size_limit_is_checked_before_parsing():
    # Over the limit and invalid: the size is what is reported (the parser never ran).
    with pytest.raises(InvalidArgument) as caught:
        parse(b"\xff" * 20, size_max_bytes=10)
    assert caught.value.reason == "JSON_TOO_LARGE"


def test_surrounding_json_whitespace_is_accepted():
    assert parse(b' \t\r\n{"a":1}\n ') == {"a": 1}


def test_a_paired_surrogate_escape_is_one_character():
    assert parse(b'{"e":"\\ud83d\\ude00"}') == {"e": "\U0001f600"}
    assert canonical_bytes(parse(b'{"e":"\\ud83d\\ude00"}')) == '{"e":"\U0001f600"}'.encode("utf-8")


def test_options_for_non_object_and_empty_values():
    assert parse(b"[1,2]", require_object=False) == [1, 2]
    assert parse(b"", allow_empty=True) is None
    with pytest.raises(InvalidArgument) as caught:
        parse(b"[1,1e400]", require_object=False)
    assert caught.value.reason == "JSON_INVALID"


def test_large_service_integers_are_written_exactly_in_canonical_order():
    """64-bit budget amounts exceed JCS's integer domain; they are written as exact literals."""
    value = {"b": [2**62, 1, "x"], "a": -(2**60) - 1, "c": "\u0000plain"}
    text = canonical_bytes(value)
    assert text == b'{"a":-1152921504606846977,"b":[4611686018427387904,1,"x"],"c":"\\u0000plain"}'
    assert json.loads(text) == value


# --- the standard library's encoder, where it agrees with RFC 8785 ----------------------------

control_heavy_text = st.text(
    alphabet=st.characters(exclude_categories=("Cs",))
    | st.sampled_from(['"', "\\", "\u2028", "\x7f"])
    | st.characters(max_codepoint=0x1F),
    max_size=12,
)
no_float_scalars = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | control_heavy_text
ascii_keys = st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=8)
no_float_values = st.recursive(
    no_float_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ascii_keys, children, max_size=4),
    max_leaves=24,
)


def rfc8785_reference(value) -> bytes:
    """The ``rfc8785`` package's bytes, with the service's one extension (exact large integers)."""
    import os

    import rfc8785

    from effect_ledger.domain import canonical

    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        nonce = os.urandom(8).hex()
        found: list[int] = []
        text = rfc8785.dumps(canonical._mark_large_integers(value, nonce, found))
        for number in found:
            text = text.replace(f'"\\u0000{nonce}:{number}"'.encode(), str(number).encode())
        return text


@given(value=no_float_values)
def test_the_fast_encoder_writes_exactly_what_rfc8785_writes(value):
    assert canonical_bytes(value) == rfc8785_reference(value)


@given(value=json_values)
def test_values_with_floats_or_wide_keys_still_agree_with_rfc8785(value):
    import rfc8785

    try:
        expected = rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        return
    assert canonical_bytes(value) == expected


def test_floats_and_non_ascii_keys_take_the_rfc8785_path():
    from effect_ledger.domain.canonical import _without_floats_or_wide_keys

    assert _without_floats_or_wide_keys({"a": [1, "x", None, True, {"b": 2**64}]})
    assert not _without_floats_or_wide_keys({"a": 1.5})
    assert not _without_floats_or_wide_keys({"\U0001f600": 1, "\ufb01": 2})
    # UTF-16 order puts U+1F600 (a surrogate pair, 0xD83D...) before U+FB01; code points do not.
    assert canonical_bytes({"\U0001f600": 1, "\ufb01": 2}) == '{"\U0001f600":1,"\ufb01":2}'.encode()
    assert canonical_bytes({"x": 1e21, "y": 0.1}) == b'{"x":1e+21,"y":0.1}'
