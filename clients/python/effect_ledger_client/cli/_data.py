"""Messages as plain data and back, for JSON and YAML.

Messages become what ``google.protobuf.json_format`` makes of them, with the proto's field
names, every field without presence printed, and 64-bit integers as numbers where a double
holds them exactly. One difference: a ``bytes`` field whose name ends in ``_json`` holds UTF-8
JSON, and it is given as that JSON value (``null`` when empty), never as base64. Read back,
such a field takes a JSON value (a YAML mapping, a list, ...), which is encoded for the call.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from effect_ledger_client.cli._values import BadValue

JSON_FIELD_SUFFIX = "_json"
# A contract, a receipt or a lookup answer is a few KiB; the ledger refuses messages over 4 MiB.
DOCUMENT_SIZE_MAX_BYTES = 4 * 1024 * 1024

M = TypeVar("M", bound=Message)


def is_json_field(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_BYTES and field.name.endswith(JSON_FIELD_SUFFIX)


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def json_value(raw: bytes) -> Any:
    """The JSON value UTF-8 JSON bytes hold; None for no bytes; the text itself when it is not
    JSON (the ledger stores only valid JSON, so that is a message from somewhere else)."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def message_to_data(message: Message) -> dict[str, Any]:
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        unquote_int64_if_possible=True,
    )
    _decode_json_fields(message, data)
    return data


def _decode_json_fields(message: Message, data: dict[str, Any]) -> None:
    for field in message.DESCRIPTOR.fields:
        if field.name not in data:
            continue
        value = getattr(message, field.name)
        if is_json_field(field):
            data[field.name] = [json_value(v) for v in value] if _is_repeated(field) else json_value(value)
        elif field.type != FieldDescriptor.TYPE_MESSAGE or not isinstance(data[field.name], dict | list):
            continue  # a scalar, or a well-known type printed as a string (a Timestamp)
        elif _is_map(field):
            if field.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE:
                for key, item in value.items():
                    _decode_json_fields(item, data[field.name][str(key)])
        elif _is_repeated(field):
            for item, item_data in zip(value, data[field.name], strict=True):
                if isinstance(item_data, dict):
                    _decode_json_fields(item, item_data)
        else:
            _decode_json_fields(value, data[field.name])


def data_to_message(data: Any, message_class: type[M], what: str) -> M:
    """A message from plain data with its proto field names; ``what`` names the source in errors."""
    if not isinstance(data, Mapping):
        raise BadValue(f"{what}: expected a mapping of {message_class.DESCRIPTOR.name} fields")
    prepared = _encode_json_fields(message_class.DESCRIPTOR, data, what)
    try:
        return json_format.ParseDict(prepared, message_class())
    except json_format.ParseError as error:
        raise BadValue(f"{what}: {error}") from None


def _encode_json_fields(descriptor: Descriptor, data: Mapping[str, Any], what: str) -> dict[str, Any]:
    fields = {**descriptor.fields_by_camelcase_name, **descriptor.fields_by_name}
    prepared: dict[str, Any] = {}
    for key, value in data.items():
        field = fields.get(key) if isinstance(key, str) else None
        if value is None or field is None:
            prepared[key] = _plain(value)  # ParseDict names an unknown field
        elif is_json_field(field):
            label = f"{what}: {key}"
            if _is_repeated(field) and isinstance(value, list):
                prepared[key] = [_base64_json(v, label) for v in value]
            else:
                prepared[key] = _base64_json(value, label)
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not _is_map(field) and isinstance(value, Mapping):
            prepared[key] = _encode_json_fields(field.message_type, value, what)
        elif field.type == FieldDescriptor.TYPE_MESSAGE and _is_repeated(field) and isinstance(value, list):
            prepared[key] = [
                _encode_json_fields(field.message_type, v, what) if isinstance(v, Mapping) else _plain(v) for v in value
            ]
        else:
            prepared[key] = _plain(value)
    return prepared


def _base64_json(value: Any, what: str) -> str:
    """A JSON value as UTF-8 JSON bytes, in base64 as the proto JSON mapping gives bytes."""
    try:
        text = json.dumps(_plain(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise BadValue(f"{what}: not a JSON value ({error})") from None
    return base64.b64encode(text.encode()).decode()


def _plain(value: Any) -> Any:
    """YAML reads an unquoted instant as a datetime; the proto JSON mapping wants its text."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return moment.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def parse_document(text: str, what: str) -> Any:
    """YAML or JSON text (JSON is YAML; the JSON parser is tried first for its exact numbers)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    import yaml  # type: ignore[import-untyped]  # (no stubs in the cli extra)

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise BadValue(f"{what}: neither JSON nor YAML ({' '.join(str(error).split())})") from None


def read_document(path: Path) -> Any:
    """The YAML or JSON document in a file (``-``: standard input)."""
    if str(path) == "-":
        text = sys.stdin.read(DOCUMENT_SIZE_MAX_BYTES + 1)
    else:
        try:
            with path.open(encoding="utf-8") as file:
                text = file.read(DOCUMENT_SIZE_MAX_BYTES + 1)
        except (OSError, UnicodeDecodeError) as error:
            raise BadValue(f"{path}: {error.strerror if isinstance(error, OSError) else error}") from None
    if len(text) > DOCUMENT_SIZE_MAX_BYTES:
        raise BadValue(f"{path}: larger than {DOCUMENT_SIZE_MAX_BYTES} bytes")
    return parse_document(text, str(path))
