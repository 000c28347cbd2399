"""The base of every config model: a misspelt setting is an error, each field's docstring is its
description, and a config can be frozen.

A run resolves its config once (:meth:`agentrl.config.run.RunConfig.resolved`) and freezes what comes out,
so that no part of a run can change a setting under another: assigning to any field of a frozen config, at
any depth, raises :class:`FrozenConfigError`. A change is a new config (``model_copy(update=...)``, or
:meth:`RunConfig.with_changes`, which resolves its result again). Only pydantic and the standard library here.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from agentrl.core.errors import ConfigError

S = TypeVar("S", bound="Section")


class FrozenConfigError(ConfigError, AttributeError):
    """An assignment to a frozen (resolved) config. An ``AttributeError``, as a frozen dataclass raises."""

    code = "config.frozen"


class Section(BaseModel):
    """A config model (a whole config or one of its sections)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)  # a misspelt setting: an error

    def __setattr__(self, name: str, value: Any) -> None:
        if (self.__pydantic_private__ or {}).get("_frozen"):
            raise FrozenConfigError(f"{type(self).__name__}.{name}: this config is resolved and frozen; make a "
                                    "changed copy instead (model_copy(update=...), or RunConfig.with_changes)")
        super().__setattr__(name, value)

    def __eq__(self, other: object) -> bool:  # equal values are equal configs, frozen or not
        if not isinstance(other, BaseModel):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__ and (
            self.__pydantic_extra__ == other.__pydantic_extra__)

    __hash__ = None  # type: ignore[assignment]  # mutable until frozen, as pydantic's models

    @property
    def is_frozen(self) -> bool:
        """Whether assignments to this config (and every section in it) are refused."""
        return bool((self.__pydantic_private__ or {}).get("_frozen"))

    def frozen(self: S) -> S:
        """A deep copy of this config in which no field, at any depth, can be assigned."""
        out = self.model_copy(deep=True)
        _set_frozen(out, True)
        return out

    def thawed(self: S) -> S:
        """A deep copy of this config that can be changed (the inverse of :meth:`frozen`)."""
        out = self.model_copy(deep=True)
        _set_frozen(out, False)
        return out


def _set_frozen(value: Any, frozen: bool) -> None:
    if isinstance(value, Section):
        if value.__pydantic_private__ is None:
            object.__setattr__(value, "__pydantic_private__", {})
        value.__pydantic_private__["_frozen"] = frozen
        for name in type(value).model_fields:
            _set_frozen(value.__dict__.get(name), frozen)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _set_frozen(v, frozen)
    elif isinstance(value, dict):
        for v in value.values():
            _set_frozen(v, frozen)


def given(model: BaseModel) -> dict[str, Any]:
    """The settings given to ``model``, as data to validate again: its set fields (set by a file, a flag or a
    validator), nested models recursed. Unlike ``model_dump(exclude_unset=True)`` this keeps the fields that
    are never dumped (``exclude=True``: a token), so a config rebuilt from it loses nothing."""
    return {name: _given_value(getattr(model, name)) for name in model.model_fields_set}


def _given_value(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return given(value)
    if isinstance(value, (list, tuple)):
        return [_given_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _given_value(v) for k, v in value.items()}
    return value
