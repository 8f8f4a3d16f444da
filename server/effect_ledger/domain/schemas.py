"""Arguments schemas (JSON Schema 2020-12): what registration accepts, and bounded validation.

A tool contract's arguments schema is tenant input that the gate runs on every AuthorizeEffect.
The checks run in a small pool of worker processes, never on the server's event loop
(``service/argument_checks.py``), but a worker is a shared resource all the same: every tenant's
checks wait for the same few workers. So everything a schema can make a worker do is bounded
when it is registered, and again while it runs:

- its size (``SCHEMA_SIZE_MAX_BYTES`` of canonical JSON), JSON nesting (``SCHEMA_DEPTH_MAX``)
  and number of subschemas (``SUBSCHEMAS_MAX``);
- ``$ref`` only to a subschema of the same document, as a JSON pointer (``#`` or ``#/...``),
  with no cycle that returns to the same instance without descending into it; no ``$id``,
  ``$dynamicRef``, ``$recursiveRef`` or ``$vocabulary``, and ``$schema`` only at the root and only
  the 2020-12 dialect. Validation uses a ``referencing`` registry that retrieves nothing, so
  even a schema stored before these checks existed never makes the server fetch a URL;
- ``pattern`` and ``patternProperties`` run in RE2 (``google-re2``), a linear-time engine:
  a pattern RE2 cannot compile (backreferences, lookaround) is refused, and so are more than
  ``PATTERNS_MAX`` patterns or one longer than ``PATTERN_LENGTH_MAX`` characters.
  ``format`` is an annotation and is not asserted (``format: regex`` runs nothing);
- ``unevaluatedProperties`` and ``unevaluatedItems`` are refused: the validator library
  evaluates them with Python's backtracking ``re`` and with scans quadratic in the instance;
- every validation has a budget of ``VALIDATION_STEPS_MAX`` steps (a keyword applied to a
  value costs one step plus one per ``WEIGHT_PER_STEP`` units of the size of the keyword's
  value and of the value checked; an error found costs one). Arguments that need more are
  refused (ARGUMENTS_CHECK_TOO_COSTLY) rather than checked for longer.

Validators are compiled once per (tenant, tool, revision) in each worker process and kept
there in a bounded LRU cache (``VALIDATORS_CACHED_MAX``); a contract revision never changes,
so an entry never goes stale.
"""

from __future__ import annotations

import contextvars
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import jsonschema
import re2
import referencing
import referencing.exceptions
from jsonschema import ValidationError

from effect_ledger.domain.canonical import canonical_bytes
from effect_ledger.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    PreconditionViolation,
)

SCHEMA_SIZE_MAX_BYTES = 64 * 1024
SCHEMA_DEPTH_MAX = 24
# Checking a schema against the 2020-12 metaschema costs about 0.2 ms per subschema.
SUBSCHEMAS_MAX = 512
PATTERNS_MAX = 128
PATTERN_LENGTH_MAX = 1024
# RE2's memory budget for one compiled pattern (its program and its DFA cache).
PATTERN_MEMORY_MAX_BYTES = 1024 * 1024
# About 3 to 6 microseconds a step: a bounded check takes at most about 0.3 s, and arguments of
# the largest size (64 KiB) against a plain object schema take a quarter to a half of it.
VALIDATION_STEPS_MAX = 50_000
WEIGHT_PER_STEP = 64
VALIDATORS_CACHED_MAX = 256
VIOLATIONS_MAX = 20
PROBLEMS_MAX = 10
DIALECT = "https://json-schema.org/draft/2020-12/schema"

# Keywords whose value is one subschema, a map of subschemas, or a list of subschemas.
SINGLE = (
    "additionalProperties",
    "propertyNames",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
)
MAPPED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
LISTED = ("allOf", "anyOf", "oneOf", "prefixItems")
# Keywords that apply their subschemas to the same value (a cycle of them never ends).
IN_PLACE_SINGLE = ("not", "if", "then", "else")
IN_PLACE_LISTED = ("allOf", "anyOf", "oneOf")
REFUSED = {
    "$id": "is not supported: the schema is named by its tool and revision, and $ref stays inside it",
    "$dynamicRef": "is not supported: use $ref to a JSON pointer inside this document",
    "$recursiveRef": "is not supported: use $ref to a JSON pointer inside this document",
    "$vocabulary": "is not supported: arguments schemas use the 2020-12 dialect",
    "unevaluatedProperties": "is not supported (use additionalProperties)",
    "unevaluatedItems": "is not supported (use items)",
}


class SchemaUnusable(Exception):
    """A schema that registration would refuse; ``problems`` say why."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# --- what registration accepts -------------------------------------------------------------


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _json_depth(value: Any) -> int:
    """Nesting depth without recursion, stopping early past the limit."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > SCHEMA_DEPTH_MAX:
                return deepest
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def compile_pattern(pattern: str) -> Any:
    options = re2.Options()
    options.max_mem = PATTERN_MEMORY_MAX_BYTES
    options.log_errors = False
    return re2.compile(pattern, options)


@dataclass
class _Walk:
    """What one pass over the schema's subschemas found."""

    problems: list[str] = field(default_factory=list)
    subschemas: set[str] = field(default_factory=set)
    references: list[tuple[str, str]] = field(default_factory=list)  # (where, target pointer)
    in_place: dict[str, list[str]] = field(default_factory=dict)  # pointer -> same-value subschemas
    patterns: dict[str, Any] = field(default_factory=dict)

    def problem(self, where: str, description: str) -> None:
        if len(self.problems) < PROBLEMS_MAX:
            self.problems.append(f"{where or '/'}: {description}")

    def pattern(self, where: str, pattern: Any) -> None:
        if not isinstance(pattern, str):
            return  # the metaschema names the type
        if len(pattern) > PATTERN_LENGTH_MAX:
            self.problem(where, f"a pattern longer than {PATTERN_LENGTH_MAX} characters")
        elif pattern not in self.patterns:
            if len(self.patterns) == PATTERNS_MAX:
                self.problem(where, f"more than {PATTERNS_MAX} distinct patterns")
                return
            try:
                self.patterns[pattern] = compile_pattern(pattern)
            except re2.error as error:
                detail = (
                    error.args[0].decode("utf-8", "replace")
                    if error.args and isinstance(error.args[0], bytes)
                    else str(error)
                )
                self.problem(
                    where,
                    f"the pattern {pattern[:100]!r} is not one RE2 runs (linear time only): {detail[:200]}",
                )


def _children(node: dict[str, Any], where: str) -> Iterator[tuple[str, Any, str]]:
    """(keyword, subschema, pointer) for every subschema directly under ``node``."""
    for keyword in SINGLE:
        if keyword in node:
            yield keyword, node[keyword], f"{where}/{_escape(keyword)}"
    for keyword in MAPPED:
        if isinstance(node.get(keyword), dict):
            for name, child in node[keyword].items():
                yield keyword, child, f"{where}/{_escape(keyword)}/{_escape(name)}"
    for keyword in LISTED:
        if isinstance(node.get(keyword), list):
            for index, child in enumerate(node[keyword]):
                yield keyword, child, f"{where}/{keyword}/{index}"


def _visit(walk: _Walk, node: dict[str, Any], where: str) -> None:
    for keyword, description in REFUSED.items():
        if keyword in node:
            walk.problem(f"{where}/{_escape(keyword)}", description)
    if "$schema" in node and (where or node["$schema"] not in (DIALECT, DIALECT + "#")):
        walk.problem(f"{where}/$schema", f"only {DIALECT}, and only at the root")
    reference = node.get("$ref")
    if reference is not None:
        if not isinstance(reference, str) or not (reference == "#" or reference.startswith("#/")):
            walk.problem(f"{where}/$ref", "must be a JSON pointer inside this document ('#' or '#/...')")
        else:
            target = unquote(reference[1:])
            walk.references.append((f"{where}/$ref", target))
            walk.in_place.setdefault(where, []).append(target)
    walk.pattern(f"{where}/pattern", node.get("pattern"))
    if isinstance(node.get("patternProperties"), dict):
        for pattern in node["patternProperties"]:
            walk.pattern(f"{where}/patternProperties/{_escape(pattern)}", pattern)


def _walk(schema: Any) -> _Walk:
    walk = _Walk()
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, where = stack.pop()
        walk.subschemas.add(where)
        if len(walk.subschemas) > SUBSCHEMAS_MAX:
            walk.problem("", f"has more than {SUBSCHEMAS_MAX} subschemas")
            return walk
        if not isinstance(node, dict):
            continue  # booleans are schemas; anything else the metaschema refuses
        _visit(walk, node, where)
        for keyword, child, pointer in _children(node, where):
            stack.append((child, pointer))
            if keyword in IN_PLACE_SINGLE or keyword in IN_PLACE_LISTED or keyword == "dependentSchemas":
                walk.in_place.setdefault(where, []).append(pointer)
    return walk


def _cycle(edges: dict[str, list[str]]) -> str | None:
    """A subschema from which same-value applications ($ref, allOf, ...) lead back to itself."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in edges:
        if state.get(start):
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(edges.get(start, ())))]
        state[start] = 1
        while stack:
            node, pending = stack[-1]
            following = next(pending, None)
            if following is None:
                state[node] = 2
                stack.pop()
            elif state.get(following) == 1:
                return following
            elif not state.get(following):
                state[following] = 1
                stack.append((following, iter(edges.get(following, ()))))
    return None


def schema_problems(schema: Any) -> tuple[list[str], dict[str, Any]]:
    """Why the schema cannot be an arguments schema (empty: it can), and its compiled patterns."""
    if not isinstance(schema, (dict, bool)):
        return ["/: must be a JSON object or a boolean"], {}
    if _json_depth(schema) > SCHEMA_DEPTH_MAX:
        return [f"/: nests deeper than {SCHEMA_DEPTH_MAX} levels"], {}
    size = len(canonical_bytes(schema))
    if size > SCHEMA_SIZE_MAX_BYTES:
        return [f"/: is {size} bytes; at most {SCHEMA_SIZE_MAX_BYTES} allowed"], {}
    walk = _walk(schema)
    if walk.problems:
        return walk.problems, {}
    try:
        jsonschema.Draft202012Validator.check_schema(schema, format_checker=None)
    except jsonschema.SchemaError as error:
        where = "".join(f"/{_escape(str(part))}" for part in error.path)
        return [f"{where or '/'}: is not a JSON Schema: {error.message[:300]}"], {}
    for where, target in walk.references:
        if target not in walk.subschemas:
            walk.problem(where, f"#{target[:200]} is not a subschema of this document")
    looping = _cycle(walk.in_place)
    if looping is not None:
        walk.problem(looping, "$ref leads back here without descending into the value (an endless loop)")
    return walk.problems, walk.patterns


def schema_violations(schema: Any, field_name: str) -> list[FieldViolation]:
    """Registration's refusals of an arguments schema, each naming ``field_name``."""
    problems, _patterns = schema_problems(schema)
    return [FieldViolation(field_name, problem) for problem in problems]


# --- bounded validation --------------------------------------------------------------------


class _Exhausted(Exception):
    """The validation spent its budget."""


@dataclass
class _Run:
    """One validation in progress: its compiled patterns, remaining steps and size memo."""

    patterns: dict[str, Any]
    steps_left: int
    weights: dict[int, int] = field(default_factory=dict)

    def regex(self, pattern: str) -> Any:
        compiled = self.patterns.get(pattern)
        if compiled is None:
            compiled = self.patterns[pattern] = compile_pattern(pattern)
        return compiled

    def weight(self, value: Any) -> int:
        """About how many characters ``value`` spans in JSON, memoized per container."""
        if isinstance(value, str):
            return len(value)
        if not isinstance(value, (dict, list)):
            return 1
        known = self.weights.get(id(value))
        if known is not None:
            return known
        order: list[Any] = []
        stack = [value]
        while stack:
            item = stack.pop()
            if id(item) in self.weights:
                continue
            order.append(item)
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, (dict, list)):
                    stack.append(child)
        for item in reversed(order):
            total = 1
            for key, child in item.items() if isinstance(item, dict) else enumerate(item):
                total += (len(key) if isinstance(key, str) else 0) + (
                    self.weights.get(id(child), 1) if isinstance(child, (dict, list)) else self.weight(child)
                )
            self.weights[id(item)] = total
        return self.weights[id(value)]

    def spend(self, steps: int) -> None:
        self.steps_left -= steps
        if self.steps_left < 0:
            raise _Exhausted()


_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("schema_run", default=None)


def _run() -> _Run:
    return _RUN.get() or _Run(patterns={}, steps_left=VALIDATION_STEPS_MAX)


def _counted(errors: Any, run: _Run) -> Iterator[ValidationError]:
    for error in errors:
        run.spend(1)
        yield error


def _budgeted(keyword: Any) -> Any:
    def apply(validator, value, instance, schema):
        run = _run()
        run.spend(1 + (run.weight(value) + run.weight(instance)) // WEIGHT_PER_STEP)
        errors = keyword(validator, value, instance, schema)
        return None if errors is None else _counted(errors, run)

    return apply


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and _run().regex(pattern).search(instance) is None:
        yield ValidationError(f"{instance[:100]!r} does not match {pattern[:100]!r}")


def _pattern_properties(validator, pattern_properties, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    run = _run()
    for pattern, subschema in pattern_properties.items():
        compiled = run.regex(pattern)
        for key, value in instance.items():
            if compiled.search(key) is not None:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    properties = schema.get("properties", {})
    run = _run()
    patterns = [run.regex(p) for p in schema.get("patternProperties", {})]
    return [key for key in instance if key not in properties and not any(p.search(key) is not None for p in patterns)]


def _additional_properties(validator, additional, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        shown = ", ".join(repr(key[:100]) for key in sorted(extras)[:10])
        verb = "was" if len(extras) == 1 else "were"
        yield ValidationError(f"Additional properties are not allowed ({shown} {verb} unexpected)")


def _frozen(value: Any) -> Hashable:
    """A hashable form under JSON Schema equality (1 == 1.0, true != 1, key order ignored)."""
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(_frozen(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((key, _frozen(item)) for key, item in value.items()))
    return ("value", value)


def _unique_items(validator, unique, instance, schema):
    """uniqueItems in linear time (the library's falls back to comparing every pair)."""
    if not (unique and validator.is_type(instance, "array")):
        return
    if len({_frozen(item) for item in instance}) != len(instance):
        yield ValidationError("the array has non-unique elements")


_OVERRIDES = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}
BoundedValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {
        name: _budgeted(_OVERRIDES.get(name, keyword))
        for name, keyword in jsonschema.Draft202012Validator.VALIDATORS.items()
        if name not in ("unevaluatedProperties", "unevaluatedItems")
    },
)


def _refuse_retrieval(uri: str) -> referencing.Resource:
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


# Retrieves nothing: a $ref that is not inside the schema is unresolvable, never fetched.
NO_RETRIEVAL = referencing.Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


@dataclass(frozen=True)
class CompiledSchema:
    schema: Any
    validator: Any = None
    patterns: dict[str, Any] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


def compile_schema(schema: Any) -> CompiledSchema:
    """The checks of registration, then a validator that retrieves nothing and runs RE2."""
    problems, patterns = schema_problems(schema)
    if problems:
        return CompiledSchema(schema, problems=tuple(problems))
    return CompiledSchema(schema, BoundedValidator(schema, registry=NO_RETRIEVAL), patterns)


class ValidatorCache:
    """Compiled schemas by key ((tenant, tool, revision)), least recently used evicted first.
    Shared by the worker threads that check arguments: its changes are made under a lock."""

    def __init__(self, size_max: int = VALIDATORS_CACHED_MAX) -> None:
        self.size_max = size_max
        self._entries: OrderedDict[Hashable, CompiledSchema] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable | None, schema: Any) -> CompiledSchema:
        if key is None:
            return compile_schema(schema)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry
        compiled = compile_schema(schema)  # outside the lock: a revision never changes, so a
        with self._lock:  # second thread compiling the same key compiles the same thing
            entry = self._entries.setdefault(key, compiled)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size_max:
                self._entries.popitem(last=False)
        return entry

    def __len__(self) -> int:
        return len(self._entries)


VALIDATORS = ValidatorCache()


def _path_text(path: Any) -> str:
    return "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in path)


def _unusable(subject: str, description: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"the arguments schema of {subject} cannot be used: {description} (register a new revision)",
        reason="ARGUMENTS_SCHEMA_UNUSABLE",
        violations=[PreconditionViolation("ARGUMENTS_SCHEMA_UNUSABLE", subject, description)],
    )


def argument_violations(
    schema: Any,
    arguments: Any,
    *,
    tenant_id: str | None = None,
    tool: str = "",
    revision: int = 0,
    cache: ValidatorCache = VALIDATORS,
) -> list[FieldViolation]:
    """The arguments' violations of the schema (the first ``VIOLATIONS_MAX`` found, sorted by path).

    The compiled schema is cached under (tenant_id, tool, revision) when a tenant is given.
    Raises FailedPrecondition (ARGUMENTS_SCHEMA_UNUSABLE) for a stored schema that registration
    would now refuse, and InvalidArgument (ARGUMENTS_CHECK_TOO_COSTLY) when the check needs more
    than ``VALIDATION_STEPS_MAX`` steps.
    """
    subject = f"tool/{tool}@{revision}" if tool else "tool"
    compiled = cache.get((tenant_id, tool, revision) if tenant_id is not None else None, schema)
    if compiled.problems:
        raise _unusable(subject, "; ".join(compiled.problems))
    found = []
    token = _RUN.set(_Run(patterns=compiled.patterns, steps_left=VALIDATION_STEPS_MAX))
    try:
        for error in compiled.validator.iter_errors(arguments):
            found.append(error)
            if len(found) == VIOLATIONS_MAX:
                break
    except (_Exhausted, RecursionError):
        raise InvalidArgument.field(
            "arguments_json",
            f"checking the arguments against the tool's schema takes more than {VALIDATION_STEPS_MAX} steps",
            reason="ARGUMENTS_CHECK_TOO_COSTLY",
        ) from None
    except referencing.exceptions.Unresolvable as error:
        raise _unusable(subject, f"it refers to {str(error.ref)[:200]!r}, which is not part of it") from None
    finally:
        _RUN.reset(token)
    found.sort(key=lambda e: list(map(str, e.path)))
    return [FieldViolation(f"arguments_json{_path_text(e.path)}", e.message[:500]) for e in found]
