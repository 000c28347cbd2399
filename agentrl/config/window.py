"""A run's context window when it serves a model directory: the one rule ``agentrl train``, ``agentrl eval``
and ``agentrl serve-policy`` share.

The window is two settings, ``inference.max_model_len`` (the engines') and ``sampling.max_context_tokens``
(the episodes'), and a run holds the smaller (``RunConfig.context_tokens``). A model directory declares its
own (``max_position_embeddings`` in its ``config.json``: SmolLM2, 8,192): a run on it takes that window
unless its settings give one, and a setting beyond it is refused here, before any engine starts (vLLM would
refuse it later, less clearly). Only the standard library and the config models: every part of agentrl may
import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError
from agentrl.core.shape import read_window

WINDOW_SETTINGS = ("inference.max_model_len", "sampling.max_context_tokens")
"""The dotted settings that hold a run's window."""


class WindowTooLong(ConfigError, ValueError):
    """A window setting asks for more than the model directory's window (``max_position_embeddings``)."""

    code = "config.window"


def window_tables(window: int) -> dict[str, Any]:
    """Both window settings at ``window``, as config tables."""
    return {"inference": {"max_model_len": window}, "sampling": {"max_context_tokens": window}}


def given_windows(tables: Mapping[str, Any] | None) -> dict[str, int]:
    """The window settings that nested config ``tables`` give, by dotted name (an unset one is left out)."""
    out: dict[str, int] = {}
    for setting in WINDOW_SETTINGS:
        table, key = setting.split(".")
        section = (tables or {}).get(table)
        value = section.get(key) if isinstance(section, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool):
            out[setting] = value
    return out


def check_window(model: str, given: Mapping[str, int], names: Mapping[str, str] | None = None,
                 file: Path | None = None) -> None:
    """Raise :class:`WindowTooLong` when a window setting in ``given`` (dotted name -> tokens) is more than
    the window ``model``'s directory declares (nothing when it declares none: a hub id, a model not built
    yet). The message names the setting as the person gave it: its flag in ``names`` (``--max-context-tokens``),
    else the setting in ``file``, else the dotted setting."""
    declared = read_window(model)
    if declared is None:
        return
    for setting, value in given.items():
        if value <= declared:
            continue
        flag = (names or {}).get(setting)
        what = f"{flag} {value}" if flag else f"{setting} = {value}" + (f" in {file}" if file is not None else "")
        raise WindowTooLong(f"{what} is more than the window of {model} (max_position_embeddings = {declared}); "
                            f"give at most {declared}")


def model_window(model: str, given: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The window layer of a run on the model directory ``model``, as config tables to go under the settings
    that ``given`` comes from: both window settings at the smallest window ``given`` names (so that
    ``--max-context-tokens 2048`` alone also sizes the engines for 2,048 tokens), else at the window the
    directory declares; empty when neither says (a hub id keeps the defaults beneath)."""
    window = min(given.values()) if given else read_window(model)
    return window_tables(window) if window is not None else {}
