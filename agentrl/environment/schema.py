"""JSON schemas for tools, derived from a function's type hints and its docstring.

Google-style (``Args:``) and reST-style (``:param x:``) argument descriptions are both understood.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin

from agentrl.core.errors import EnvError

_PRIMITIVES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolSchemaError(EnvError, TypeError):
    """A tool's signature cannot be written as a JSON schema: an unsupported or unresolvable type hint."""

    code = "env.tool_schema"


class ArgumentSchemaError(EnvError, ValueError):
    """Tool-call arguments do not fit the tool's schema (``validate_arguments``; ``Environment.call_tool``
    reports it to the model as a ``ToolArgumentError``)."""

    code = "env.argument_schema"


def type_to_schema(tp: Any) -> dict[str, Any]:
    """JSON schema for one Python type annotation."""
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}
    if tp is type(None):
        return {"type": "null"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": [m.value for m in tp]}
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Literal:
        kinds = {type(a) for a in args}
        out: dict[str, Any] = {"enum": list(args)}
        if len(kinds) == 1 and next(iter(kinds)) in _PRIMITIVES:
            out["type"] = _PRIMITIVES[next(iter(kinds))]
        return out
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:
            return type_to_schema(non_null[0])
        return {"anyOf": [type_to_schema(a) for a in non_null]}
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set):
        item = args[0] if args else Any
        return {"type": "array", "items": type_to_schema(item)}
    if origin is dict or tp is dict:
        return {"type": "object"}
    raise ToolSchemaError(f"unsupported tool argument type: {tp!r}")


_GOOGLE_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_GOOGLE_OTHER = re.compile(r"^\s*(Returns|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_GOOGLE_ARG = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_REST_ARG = re.compile(r"^\s*:param\s+(?:\w+\s+)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into (description, {argument: description})."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    desc: list[str] = []
    params: dict[str, str] = {}
    section = "desc"
    current: str | None = None
    for line in lines:
        if _GOOGLE_SECTION.match(line):
            section, current = "args", None
            continue
        if _GOOGLE_OTHER.match(line):
            section, current = "other", None
            continue
        rest = _REST_ARG.match(line)
        if rest:
            section, current = "rest", rest.group(1)
            params[current] = rest.group(2).strip()
            continue
        if line.strip().startswith(":"):
            section, current = "other", None
            continue
        if section == "desc":
            desc.append(line)
        elif section == "args":
            m = _GOOGLE_ARG.match(line)
            indent = len(line) - len(line.lstrip())
            if m and (current is None or indent <= 4):
                current = m.group(1).lstrip("*")
                params[current] = m.group(3).strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
        elif section == "rest" and current and line.strip():
            params[current] = f"{params[current]} {line.strip()}".strip()
    return "\n".join(desc).strip(), params


def function_schema(fn: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """The OpenAI function-tool schema for ``fn`` (``self`` is skipped)."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # unresolvable forward references
        raise ToolSchemaError(f"cannot resolve type hints of tool {fn.__qualname__}: {e}") from e
    description, arg_docs = parse_docstring(fn.__doc__)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in sig.parameters.items():
        if pname == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop = type_to_schema(hints.get(pname, param.annotation))
        if pname in arg_docs:
            prop["description"] = arg_docs[pname]
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        elif param.default is not None:
            prop["default"] = param.default
        properties[pname] = prop
    return {
        "type": "function",
        "function": {
            "name": name or fn.__name__,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


def validate_arguments(schema: dict[str, Any], arguments: Any) -> dict[str, Any]:
    """Check tool-call arguments against a function schema; return them with types coerced.

    Raises :class:`ArgumentSchemaError` (a ``ValueError``) with a message meant for the model to read.
    """
    params = schema["function"]["parameters"]
    name = schema["function"]["name"]
    if not isinstance(arguments, dict):
        raise ArgumentSchemaError(f"arguments of {name} must be a JSON object, got {type(arguments).__name__}")
    props: dict[str, Any] = params["properties"]
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        raise ArgumentSchemaError(f"{name} got unknown argument(s) {unknown}; expected {sorted(props)}")
    missing = [r for r in params["required"] if r not in arguments]
    if missing:
        raise ArgumentSchemaError(f"{name} is missing required argument(s) {missing}")
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        out[key] = _coerce(name, key, props[key], value)
    return out


def _coerce(tool: str, key: str, prop: dict[str, Any], value: Any) -> Any:
    kind = prop.get("type")
    bad = ArgumentSchemaError(f"argument {key!r} of {tool} must be of type {kind}, got {value!r}")
    if "enum" in prop and value not in prop["enum"]:
        raise ArgumentSchemaError(f"argument {key!r} of {tool} must be one of {prop['enum']}, got {value!r}")
    if kind == "string":
        if not isinstance(value, str):
            raise bad
    elif kind == "integer":
        if isinstance(value, bool):
            raise bad
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int):
            raise bad
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise bad
    elif kind == "array":
        if not isinstance(value, list):
            raise bad
    elif kind == "object" and not isinstance(value, dict):
        raise bad
    return value
