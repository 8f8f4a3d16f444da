"""Tenant input that could stall the server or escape as INTERNAL, refused by the domain.

Arguments schemas (domain/schemas.py): what registration refuses, that validation never
retrieves a document, that patterns run in linear time, and that every check is bounded.
Also the one text check (control characters), archive members judged from their headers,
manifest fields, the one enum conversion, and what a remote-OPA fault tells a client.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import tarfile
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import pytest
import referencing.exceptions

from effect_ledger.domain import checkpoints, schemas
from effect_ledger.domain.budgets import check_dimension
from effect_ledger.domain.contracts import (
    check_identifier,
    check_target,
    check_text,
    check_tool_name,
)
from effect_ledger.errors import FailedPrecondition, InvalidArgument, PolicyUnavailable

PATHOLOGICAL = "^(a+)+$"
PATHOLOGICAL_INPUT = "a" * 27 + "!"  # Python's re needs seconds for this; each extra "a" doubles it


# --- a local HTTP server that counts what it is asked for ----------------------------------


class CountingServer:
    """Serves a JSON Schema at every path and counts the requests."""

    def __init__(self) -> None:
        self.requests = 0
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                counter.requests += 1
                body = json.dumps({"type": "string"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/remote.json"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self) -> CountingServer:
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def remote():
    with CountingServer() as server:
        yield server


def remote_schema(url: str) -> dict:
    return {"type": "object", "properties": {"name": {"$ref": url}}}


# --- registration ----------------------------------------------------------------------------


def problems(schema) -> list[str]:
    found, _patterns = schemas.schema_problems(schema)
    return found


@pytest.mark.parametrize(
    ("schema", "where", "words"),
    [
        (
            remote_schema("http://127.0.0.1:9/x.json"),
            "/properties/name/$ref",
            "inside this document",
        ),
        ({"$ref": "other.json#/a"}, "/$ref", "inside this document"),
        ({"$ref": "#anchor"}, "/$ref", "inside this document"),
        ({"$ref": "#/$defs/missing"}, "/$ref", "not a subschema"),
        ({"$ref": "#/properties", "properties": {"a": True}}, "/$ref", "not a subschema"),
        (
            {"x-data": {"$ref": "http://127.0.0.1:9/"}, "$ref": "#/x-data"},
            "/$ref",
            "not a subschema",
        ),
        ({"$dynamicRef": "#meta"}, "/$dynamicRef", "not supported"),
        ({"$recursiveRef": "#"}, "/$recursiveRef", "not supported"),
        ({"$id": "http://127.0.0.1:9/base.json", "$ref": "#"}, "/$id", "not supported"),
        ({"properties": {"a": {"$id": "sub.json"}}}, "/properties/a/$id", "not supported"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "/$schema", "2020-12"),
        (
            {"properties": {"a": {"$schema": schemas.DIALECT}}},
            "/properties/a/$schema",
            "only at the root",
        ),
        ({"$vocabulary": {}}, "/$vocabulary", "not supported"),
        ({"unevaluatedProperties": False}, "/unevaluatedProperties", "not supported"),
        ({"unevaluatedItems": False}, "/unevaluatedItems", "not supported"),
        ({"pattern": "(a)\\1"}, "/pattern", "RE2"),
        ({"pattern": "(?=a)b"}, "/pattern", "RE2"),
        ({"patternProperties": {"(?<!x)y": True}}, "/patternProperties/(?<!x)y", "RE2"),
        ({"pattern": "a" * (schemas.PATTERN_LENGTH_MAX + 1)}, "/pattern", "longer than"),
        ({"$ref": "#"}, "/", "endless loop"),
        (
            {
                "$defs": {
                    "a": {"anyOf": [{"$ref": "#/$defs/b"}]},
                    "b": {"not": {"$ref": "#/$defs/a"}},
                },
                "$ref": "#/$defs/a",
            },
            "/$defs/",
            "endless loop",
        ),
        ({"type": "nonsense"}, "/type", "is not a JSON Schema"),
    ],
)
def test_registration_refuses_what_could_fetch_loop_or_backtrack(schema, where, words):
    found = problems(schema)
    assert found, schema
    assert found[0].startswith(where) and words in found[0], found
    violations = schemas.schema_violations(schema, "contract.arguments_schema_json")
    assert {v.field for v in violations} == {"contract.arguments_schema_json"}


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/name"}},
            "$defs": {"name": {"type": "string"}},
        },
        {"$schema": schemas.DIALECT, "type": "object"},
        {"properties": {"$id": {"type": "string"}, "$ref": {"const": "http://x/"}}},  # property names, not keywords
        {"enum": [{"$ref": "http://127.0.0.1:9/"}]},  # data, not a schema
        {"type": "array", "items": {"$ref": "#"}},  # recursion that descends: fine
        {"properties": {"a~b/c": {"type": "string"}, "d": {"$ref": "#/properties/a~0b~1c"}}},
        {"patternProperties": {"^x-[a-z]+$": {"type": "string"}}, "additionalProperties": False},
        {"pattern": "^\\p{L}+$"},
        True,
    ],
)
def test_registration_accepts_ordinary_schemas(schema):
    assert problems(schema) == []


def test_limits_of_size_depth_subschemas_and_patterns():
    deep: dict = {"type": "string"}
    for _ in range(schemas.SCHEMA_DEPTH_MAX):
        deep = {"not": deep}
    assert "nests deeper" in problems(deep)[0]
    big = {"enum": ["x" * 1000 for _ in range(70)]}
    assert f"at most {schemas.SCHEMA_SIZE_MAX_BYTES}" in problems(big)[0]
    many = {"anyOf": [{"type": "string"} for _ in range(schemas.SUBSCHEMAS_MAX + 1)]}
    assert "subschemas" in problems(many)[0]
    patterns = {"properties": {f"p{n}": {"pattern": f"^{n}$"} for n in range(schemas.PATTERNS_MAX + 1)}}
    assert "distinct patterns" in " ".join(problems(patterns))
    assert problems({"properties": {f"p{n}": {"pattern": f"^{n}$"} for n in range(schemas.PATTERNS_MAX)}}) == []


# --- validation never retrieves --------------------------------------------------------------


def test_the_counting_server_counts(remote):
    """The control: the library's default validator does fetch a remote $ref (deprecated)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        errors = list(jsonschema.Draft202012Validator(remote_schema(remote.url)).iter_errors({"name": 5}))
    assert errors and remote.requests == 1


def test_a_stored_schema_with_a_remote_ref_is_unusable_and_fetches_nothing(remote):
    """A schema stored before registration refused remote refs: the gate refuses to use it."""
    cache = schemas.ValidatorCache()
    for _ in range(2):
        with pytest.raises(FailedPrecondition) as caught:
            schemas.argument_violations(
                remote_schema(remote.url),
                {"name": 5},
                tenant_id="t",
                tool="email.send",
                revision=3,
                cache=cache,
            )
        assert caught.value.reason == "ARGUMENTS_SCHEMA_UNUSABLE"
        assert [v.subject for v in caught.value.violations] == ["tool/email.send@3"]
    assert remote.requests == 0


def test_the_validator_itself_retrieves_nothing(remote):
    """Below the registration checks: the registry the validator resolves with refuses retrieval."""
    validator = schemas.BoundedValidator(remote_schema(remote.url), registry=schemas.NO_RETRIEVAL)
    with pytest.raises(referencing.exceptions.Unresolvable):
        list(validator.iter_errors({"name": 5}))
    assert remote.requests == 0


# --- linear-time patterns and bounded validation ---------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {"name": {"type": "string", "pattern": PATHOLOGICAL}}},
        {"patternProperties": {PATHOLOGICAL: {"type": "integer"}}},
        {"patternProperties": {PATHOLOGICAL: True}, "additionalProperties": False},
        {"propertyNames": {"pattern": PATHOLOGICAL}},
    ],
)
def test_a_pathological_pattern_runs_in_linear_time(schema):
    arguments = {
        "name": PATHOLOGICAL_INPUT,
        PATHOLOGICAL_INPUT: "text",
        "a" * 5000 + "!": 1,
        "aaaa": "text",
    }
    started = time.perf_counter()
    found = schemas.argument_violations(schema, arguments)
    elapsed = time.perf_counter() - started
    assert found, "the pattern does not match: a violation is expected"
    assert elapsed < 0.5, elapsed


def test_patterns_keep_their_meaning():
    schema = {
        "properties": {"code": {"pattern": "^[A-Z]{3}-\\d+$"}},
        "patternProperties": {"^x-": {"type": "string"}},
        "additionalProperties": False,
    }
    assert schemas.argument_violations(schema, {"code": "ABC-12", "x-note": "ok"}) == []
    fields = [v.field for v in schemas.argument_violations(schema, {"code": "abc", "x-note": 1, "other": 1})]
    assert fields == ["arguments_json", "arguments_json['code']", "arguments_json['x-note']"]
    # RE2 (like ECMA-262) reads "$" as the end of the text, not "before a final newline".
    assert schemas.argument_violations(schema, {"code": "ABC-12\n"})


def test_an_exponential_schema_stops_at_the_step_budget():
    """Two branches at every level of a 30-deep array: 2^30 paths without a budget."""
    schema = {
        "anyOf": [
            {"type": "array", "items": {"$ref": "#"}},
            {"type": "array", "items": {"$ref": "#"}},
        ]
    }
    assert problems(schema) == []
    arguments: object = 1
    for _ in range(30):
        arguments = [arguments]
    with pytest.raises(InvalidArgument) as caught:
        schemas.argument_violations(schema, arguments)
    assert caught.value.reason == "ARGUMENTS_CHECK_TOO_COSTLY"
    assert [v.field for v in caught.value.violations] == ["arguments_json"]


def test_large_ordinary_arguments_fit_the_budget():
    schema = {
        "type": "object",
        "required": ["items"],
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "name"],
                    "additionalProperties": False,
                    "properties": {
                        "id": {"type": "integer"},
                        "name": {"type": "string"},
                        "tags": {"type": "array"},
                    },
                },
            }
        },
    }
    arguments = {"items": [{"id": n, "name": f"n{n}", "tags": ["a"]} for n in range(1500)]}
    assert len(json.dumps(arguments, separators=(",", ":"))) < 64 * 1024
    assert schemas.argument_violations(schema, arguments) == []


def test_unique_items_compares_as_json_schema_does():
    unique = {"uniqueItems": True}
    assert schemas.argument_violations(unique, [1, True, "1", {"a": 1, "b": 2}, [1]]) == []
    assert schemas.argument_violations(unique, [1, 1.0])
    assert schemas.argument_violations(unique, [{"a": 1, "b": 2}, {"b": 2, "a": 1}])
    assert schemas.argument_violations(unique, [{"a": n} for n in range(8000)]) == []


def test_validators_are_compiled_once_per_key_in_a_bounded_cache():
    cache = schemas.ValidatorCache(size_max=2)
    schema = {"properties": {"a": {"pattern": "^x"}}}
    first = cache.get(("t", "tool", 1), schema)
    assert cache.get(("t", "tool", 1), schema) is first
    cache.get(("t", "tool", 2), schema)
    cache.get(("t", "tool", 3), schema)
    assert len(cache) == 2
    assert cache.get(("t", "tool", 1), schema) is not first  # evicted, compiled again


# --- text, identifiers, dimensions -----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "a\x00b",
        "line\nbreak",
        "tab\there",
        "esc\x1b[31mred",
        "del\x7f",
        "c1\x85",
        "sep\u2028x",
        "para\u2029",
        "bidi\u202eevil",
        "isolate\u2066x",
    ],
)
def test_text_refuses_control_characters(text):
    with pytest.raises(InvalidArgument) as caught:
        check_target(text)
    assert caught.value.reason == "CONTROL_CHARACTER"
    assert [v.field for v in caught.value.violations] == ["target"]


def test_prose_may_hold_line_feeds_and_tabs_but_nothing_else():
    assert check_text("first line\n\tsecond", "reason", required=True, lines=True)
    assert check_target("mailto:bob@example.com ✓ ünïcode")
    for text in ("a\rb", "a\x00b", "a\x1bb", "a\u202eb"):
        with pytest.raises(InvalidArgument):
            check_text(text, "reason", required=True, lines=True)


@pytest.mark.parametrize("value", ["run_1\n", "run\x00", "run\x1b", "run 1", ""])
def test_identifiers_are_matched_whole(value):
    with pytest.raises(InvalidArgument) as caught:
        check_identifier(value, "run_id")
    assert [v.field for v in caught.value.violations] == ["run_id"]


def test_tool_names_and_dimensions_are_matched_whole():
    with pytest.raises(InvalidArgument):
        check_tool_name("email.send\n")
    with pytest.raises(InvalidArgument):
        check_dimension("usd_micros\n", "dimension")


# --- archives: headers judged before any content is read ------------------------------------


def _header(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mode = kind, size, linkname, 0o644
    return info


def gnu_sparse(name: str, hole_bytes: int, data: bytes = b"x" * 512) -> bytes:
    """A GNU sparse member: ``data`` stored after a hole, so it unpacks to hole_bytes + len(data)."""
    header = bytearray(_header(name, tarfile.GNUTYPE_SPARSE, len(data)).tobuf(tarfile.GNU_FORMAT))
    header[386:398] = b"%011o\0" % hole_bytes  # first sparse entry: offset
    header[398:410] = b"%011o\0" % len(data)  # and length
    header[483:495] = b"%011o\0" % (hole_bytes + len(data))  # the unpacked size
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + data + b"\0" * (-len(data) % 512)


def plain_tar(*entries: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, content in entries:
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    return buffer.getvalue()


def test_the_sparse_builder_makes_a_sparse_member():
    data = gnu_sparse("holes.bin", 8 * 1024 * 1024) + b"\0" * 1024
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        member = archive.next()
    assert member.issparse() and member.size == 8 * 1024 * 1024 + 512


@pytest.mark.parametrize(
    ("data", "component"),
    [
        (
            b"".join(gnu_sparse(f"holes/{n:02}.bin", 8 * 1024 * 1024 - 512) for n in range(60)) + b"\0" * 1024,
            "holes/00.bin",
        ),
        (
            plain_tar(
                (_header("state.json", size=2), b"{}"),
                (_header("link", tarfile.SYMTYPE, linkname="/etc/passwd"), None),
            ),
            "link",
        ),
        (plain_tar((_header("hard", tarfile.LNKTYPE, linkname="state.json"), None)), "hard"),
        (plain_tar((_header("ledger", tarfile.DIRTYPE), None)), "ledger"),
        (plain_tar((_header("fifo", tarfile.FIFOTYPE), None)), "fifo"),
        (plain_tar((_header("dev", tarfile.CHRTYPE), None)), "dev"),
        (plain_tar((_header("bad\x1bname", size=1), b"x")), "bad\\x1bname"),
        (
            plain_tar(*[(_header(f"f{n}", size=1), b"x") for n in range(checkpoints.ARCHIVE_FILES_MAX + 1)]),
            "archive",
        ),
    ],
    ids=[
        "sparse",
        "symlink",
        "hardlink",
        "directory",
        "fifo",
        "device",
        "control character",
        "too many",
    ],
)
def test_archive_members_are_judged_from_their_headers(monkeypatch, data, component):
    reads = []
    original = tarfile.TarFile.extractfile
    monkeypatch.setattr(
        tarfile.TarFile,
        "extractfile",
        lambda self, member: reads.append(member) or original(self, member),
    )
    with pytest.raises(InvalidArgument) as caught:
        checkpoints.read_archive(data)
    assert caught.value.reason == "ARCHIVE_INVALID"
    assert [v.field for v in caught.value.violations] == [component]
    assert reads == []  # refused before any member's content was read


def test_the_unpacked_total_is_bounded_from_the_headers(monkeypatch):
    monkeypatch.setattr(checkpoints, "ARCHIVE_UNPACKED_SIZE_MAX_BYTES", 3000)
    data = plain_tar(*[(_header(f"f{n}", size=1000), b"x" * 1000) for n in range(4)])
    reads = []
    original = tarfile.TarFile.extractfile
    monkeypatch.setattr(
        tarfile.TarFile,
        "extractfile",
        lambda self, member: reads.append(member) or original(self, member),
    )
    with pytest.raises(InvalidArgument) as caught:
        checkpoints.read_archive(data)
    assert [v.field for v in caught.value.violations] == ["f3"] and "unpacked" in caught.value.message
    assert reads == []


# --- manifest fields -------------------------------------------------------------------------

MANIFEST = {
    "format_version": 2,
    "tenant_id": "t-1",
    "run_id": "run_1",
    "checkpoint_id": "chk_1",
    "revision": 4,
    "sealed_at": "2026-01-01T00:00:00.000000Z",
    "policy_revision": "abc",
    "state_digest": "sha256:" + "0" * 64,
    "artifacts": [],
    "sections": {},
    "files": {},
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("revision", "abc"),
        ("revision", -1),
        ("revision", True),
        ("revision", 1.5),
        ("run_id", 7),
        ("run_id", "run\n"),
        ("tenant_id", None),
        ("checkpoint_id", ["x"]),
        ("sealed_at", 5),
        ("policy_revision", "a\x1bb"),
        ("state_digest", "md5:x"),
        ("artifacts", "none"),
        ("sections", []),
        ("files", {"state.json": 5}),
        ("surprise", 1),
    ],
)
def test_every_manifest_field_is_type_checked(field, value):
    checkpoints.check_manifest_fields(MANIFEST)
    with pytest.raises(InvalidArgument) as caught:
        checkpoints.check_manifest_fields({**MANIFEST, field: value})
    assert caught.value.reason == "ARCHIVE_INVALID"
    assert [v.field for v in caught.value.violations] == [f"manifest.json: {field}"]


# --- enums -----------------------------------------------------------------------------------


def test_one_enum_conversion_for_every_request_field():
    from effect_ledger.domain.checkpoints import ArtifactClass
    from effect_ledger.transport.mapping import enum_value
    from effectledger.v1 import checkpoints_pb2

    assert enum_value(checkpoints_pb2.ArtifactClass, 1, "c", ArtifactClass) is ArtifactClass.REQUIRED
    assert enum_value(checkpoints_pb2.World, 2, "world") == "SIMULATED"
    assert enum_value(checkpoints_pb2.World, 0, "world", required=False) is None
    for value, reason in ((99, "INVALID_ENUM"), (-1, "INVALID_ENUM"), (0, "FIELD_REQUIRED")):
        with pytest.raises(InvalidArgument) as caught:
            enum_value(checkpoints_pb2.World, value, "world")
        assert caught.value.reason == reason
        assert [v.field for v in caught.value.violations] == ["world"]


# --- remote OPA faults name no address -------------------------------------------------------


async def test_a_remote_opa_fault_names_no_host_to_the_client(caplog):
    from effect_ledger.policy.remote import RemoteOpaEngine

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = RemoteOpaEngine(f"http://127.0.0.1:{port}", timeout_seconds=1.0)
    engine._revision, engine._revision_at = "known", time.monotonic()  # reach the decision query
    try:
        with (
            caplog.at_level(logging.WARNING, logger="effect_ledger.policy.remote"),
            pytest.raises(PolicyUnavailable) as caught,
        ):
            await engine.evaluate({"any": "input"})
    finally:
        await engine.close()
    told = caught.value.message + json.dumps(caught.value.metadata)
    for leak in ("127.0.0.1", str(port), "http"):
        assert leak not in told, told
    assert caught.value.reason == "POLICY_UNAVAILABLE"
    assert any(str(port) in record.getMessage() for record in caplog.records), caplog.text
