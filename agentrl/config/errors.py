"""Config errors a person can act on: one line per problem, naming the setting, the bad value and the fix.

pydantic's ``ValidationError`` text echoes the whole input dict (tokens included) and a link per error; the
loaders (``load_config``, ``load_server_config``, ``load_policy_config``) turn it into a
:class:`ConfigValidationError` instead, whose lines read like::

    trainer.lr: Input should be greater than 0 (got -1); set trainer.lr in run.toml
    steps: Input should be greater than or equal to 1 (got 0); fix --steps
    unknown setting 'trainer.lrr' in run.toml; did you mean 'trainer.lr'?

Only pydantic and the standard library here, like the rest of :mod:`agentrl.config`.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agentrl.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

_SECRETS = ("token", "password", "secret", "api_key", "authkey")
"""A field whose name contains one of these never has its value echoed."""


class ConfigValidationError(ConfigError, ValueError):
    """A config failed validation; ``problems`` holds one self-contained line per error (``str()`` joins
    them with newlines). A ``ValueError``, as pydantic's ``ValidationError`` is."""

    code = "config.invalid"

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems) or ["invalid configuration"]
        super().__init__("\n".join(self.problems))


class SettingError(ConfigError, ValueError):
    """A setting's value cannot be used, alone or with the others: raised by the config models' validators
    (pydantic reports it in a validation error, then :class:`ConfigValidationError`) and by their checks."""

    code = "config.setting"


def validate(
    model: type[M],
    data: Mapping[str, Any],
    *,
    file: Path | None = None,
    file_data: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
    prefix: tuple[str, ...] = (),
) -> M:
    """``model.model_validate(data)``, raising :class:`ConfigValidationError` on failure.

    ``file``/``file_data``: the TOML file the data was read from and what it held (the settings a fix should
    be made in); ``overrides``: the values that came from the command line, and ``flags`` the flag that sets
    each dotted setting (``{"steps": "--steps", "pipeline.max_staleness": "--max-staleness"}``); ``prefix``:
    the table of the file that ``data`` came from (``("server",)``), for the names in the messages."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise config_error(e, model, file=file, file_data=file_data, overrides=overrides, flags=flags,
                           prefix=prefix) from None


def config_error(
    error: ValidationError,
    model: type[BaseModel],
    *,
    file: Path | None = None,
    file_data: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
    prefix: tuple[str, ...] = (),
) -> ConfigValidationError:
    """The :class:`ConfigValidationError` that says what ``error`` (raised validating ``model``) means."""
    flags = flags or {}
    problems: list[str] = []
    for err in error.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if isinstance(p, int) or str(p).isidentifier())
        problem = _describe(err, loc, model, file, file_data, overrides or {}, flags, prefix)
        if problem not in problems:
            problems.append(problem)
    return ConfigValidationError(problems)


def _describe(err: Mapping[str, Any], loc: tuple[str | int, ...], model: type[BaseModel], file: Path | None,
              file_data: Mapping[str, Any] | None, overrides: Mapping[str, Any], flags: Mapping[str, str],
              prefix: tuple[str, ...]) -> str:
    names = tuple(str(p) for p in loc if isinstance(p, str))
    setting = _dotted(prefix + loc)
    where = f" in {file}" if file is not None and _lookup(file_data, loc) is not _MISSING else ""
    if err["type"] == "extra_forbidden":
        out = f"unknown setting {setting!r}{where}"
        guess = _closest(model, names)
        return out + (f"; did you mean {_dotted(prefix + guess)!r}?" if guess else "; remove it or fix its name")
    msg = str(err["msg"])
    if err["type"] in ("value_error", "assertion_error"):  # a validator's own message: it names the fix
        msg = str(err.get("ctx", {}).get("error") or msg.partition(", ")[2] or msg)
        if isinstance(err.get("input"), Mapping):  # a whole table's validator
            return f"{setting}: {msg}" if loc else msg
    if not loc:
        return msg
    got = "" if err["type"] == "missing" else _shown(err.get("input"), names)
    flag = flags.get(_dotted(loc))
    if _lookup(overrides, loc) is not _MISSING and flag:
        fix = f"fix {flag}"
    else:
        fix = f"set {setting} in {file if where else 'the TOML file'}" + (f" or {flag}" if flag else "")
    return f"{setting or 'config'}: {msg}{got}; {fix}"


_MISSING = object()


def _lookup(data: Mapping[str, Any] | None, loc: tuple[str | int, ...]) -> Any:
    """The value at ``loc`` in nested ``data``, or ``_MISSING``. A value given whole (a list) that failed
    inside (``endpoints[1]``) counts as given: the list is returned."""
    node: Any = data
    for i, part in enumerate(loc):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return node if i > 0 and not isinstance(node, Mapping) else _MISSING
    return _MISSING if node is None or not loc else node


def _dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value: Any, names: tuple[str, ...]) -> str:
    """`` (got VALUE)`` for a short scalar or list of scalars; nothing for secrets, tables and long values."""
    if names and any(s in names[-1].lower() for s in _SECRETS):
        return ""
    scalar = (str, int, float, bool, type(None))
    if isinstance(value, scalar) or (isinstance(value, (list, tuple)) and all(isinstance(v, scalar) for v in value)):
        text = repr(value) if not isinstance(value, bool) else str(value).lower()
        return f" (got {text})" if len(text) <= 80 else ""
    return ""


def _fields(model: type[BaseModel], path: tuple[str, ...]) -> type[BaseModel] | None:
    """The model of the table at ``path`` inside ``model`` (None: not a table)."""
    node: type[BaseModel] | None = model
    for name in path:
        field = node.model_fields.get(name) if node is not None else None
        node = _model_of(field.annotation) if field is not None else None
    return node


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def _all_paths(model: type[BaseModel], path: tuple[str, ...] = (), depth: int = 4) -> list[tuple[str, ...]]:
    out = []
    for name, field in model.model_fields.items():
        out.append((*path, name))
        sub = _model_of(field.annotation)
        if sub is not None and depth > 1:
            out += _all_paths(sub, (*path, name), depth - 1)
    return out


def _closest(model: type[BaseModel], names: tuple[str, ...]) -> tuple[str, ...] | None:
    """The known setting an unknown ``names`` most likely meant: a near spelling in the same table, else the
    same (or a near) name in another table (``lr`` at the top level: ``trainer.lr``)."""
    if not names:
        return None
    table, key = names[:-1], names[-1]
    sibling_model = _fields(model, table)
    if sibling_model is not None:
        near = difflib.get_close_matches(key, list(sibling_model.model_fields), n=1, cutoff=0.6)
        if near:
            return (*table, near[0])
    paths = [p for p in _all_paths(model) if p[:-1] != table]
    by_leaf: dict[str, tuple[str, ...]] = {}
    for p in sorted(paths, key=len):
        by_leaf.setdefault(p[-1], p)
    near = difflib.get_close_matches(key, list(by_leaf), n=1, cutoff=0.8)
    return by_leaf[near[0]] if near else None
