"""Command-line flags derived from the config: each flag names one setting, and its value type, help text and
default come from that setting's declaration (its annotation, docstring and default), so a setting is
declared once. The flag sets of the commands that take settings are here; ``agentrl.cli`` turns each into
options and reads them back as overrides; error messages name the flag of a setting through
:func:`flag_names`.

Pure: pydantic and the standard library only (no runtime module), like the rest of ``agentrl.config``.
"""

from __future__ import annotations

import functools
import re
import shlex
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from agentrl.config.errors import SettingError
from agentrl.config.presets import set_dotted

__all__ = ["DOCTOR", "EVAL", "MODEL_FLAGS", "POLICY", "SERVE_ENV", "TINKER", "TRAIN", "Flag", "flag_names", "help_text", "overrides", "setting_field", "value_type"]


@dataclass(frozen=True)
class Flag:
    """One command-line flag that sets one setting of a config model."""

    setting: str
    """The dotted setting it sets (``pipeline.max_staleness``)."""
    flag: str = ""
    """The flag; default ``--`` and the setting's last name with dashes (``--max-staleness``)."""
    switch: Any = None
    """A flag without a value: given, it sets the setting to this value (``--full``: ``trainer.lora = False``)."""
    help: str = ""
    """Help text; default: the setting's docstring. Only a switch, whose sense may be the setting's inverse,
    words its own."""
    parse: Callable[[Any], Any] | None = None
    """Turns the flag's text into the setting's value (``--agent "python a.py"`` -> a command list)."""
    metavar: str | None = None
    envvar: str | None = None
    """An environment variable that gives the value when the flag is absent."""

    @property
    def name(self) -> str:
        return self.flag or "--" + self.setting.rpartition(".")[2].replace("_", "-")

    @property
    def param(self) -> str:
        """The Python parameter name of the option (``--max-staleness`` -> ``max_staleness``)."""
        return self.name.lstrip("-").replace("-", "_")


def setting_field(model: type[BaseModel], setting: str) -> Any:
    """The pydantic field of a dotted ``setting`` of ``model`` (``pipeline.max_staleness``)."""
    *tables, last = setting.split(".")
    for table in tables:
        model = _model_of(model.model_fields[table].annotation)
    try:
        return model.model_fields[last]
    except KeyError:
        raise SettingError(f"{model.__name__} has no setting {last!r} (flag of {setting!r})") from None


def _model_of(annotation: Any) -> type[BaseModel]:
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    raise SettingError(f"{annotation!r} is not a config table")


def value_type(model: type[BaseModel], flag: Flag) -> Any:
    """The option's Python type: ``bool`` for a switch, ``str`` for a parsed flag, else the setting's type
    without ``None`` (a literal is a ``str``; a list is repeatable: ``list[str]``)."""
    if flag.switch is not None:
        return bool
    annotation = setting_field(model, flag.setting).annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    origin = typing.get_origin(annotation)
    if flag.parse is not None:  # the text of one flag, or of each of a repeated one for a table
        return list[str] if origin is dict else str
    if origin is typing.Literal:
        return str
    if origin is list:
        return list[typing.get_args(annotation)[0]]
    if annotation in (int, float, str, bool):
        return annotation
    raise SettingError(f"{flag.setting}: no command-line type for {annotation!r}; give the flag a parse")


@functools.cache
def preset_settings() -> frozenset[str]:
    """The dotted settings that some environment's preset sets (their defaults depend on the run)."""
    from agentrl.config.presets import PRESETS, preset_for

    out: set[str] = set()

    def walk(table: Mapping[str, Any], prefix: str) -> None:
        for key, value in table.items():
            if isinstance(value, Mapping) and key != "task_columns":
                walk(value, f"{prefix}{key}.")
            else:
                out.add(prefix + key)

    for env in PRESETS:
        for full in (False, True):
            walk(preset_for(env, full_weights=full, embedded=True), "")
    return frozenset(out)


def help_text(model: type[BaseModel], flag: Flag) -> str:
    """The flag's help: its own words, or the setting's docstring on one line (``x`` for ````x````), with the
    setting's default when it has a plain one that no environment's preset changes."""
    field = setting_field(model, flag.setting)
    text = flag.help or " ".join((field.description or "").split())
    text = re.sub(r"``([^`]+)``", r"`\1`", text).replace(":class:", "").replace(":mod:", "")
    default = field.default
    if flag.switch is None and default not in (None, PydanticUndefined, "", [], {}) and not flag.help:
        text += (" [default: set by the environment's preset]" if flag.setting in preset_settings()
                 else f" [default: {default}]")
    return text


def flag_names(flags: Sequence[Flag]) -> dict[str, str]:
    """Dotted setting -> its flag, for error messages that name the flag to fix."""
    return {f.setting: f.name for f in flags}


def overrides(flags: Sequence[Flag], values: Mapping[str, Any]) -> dict[str, Any]:
    """The nested overrides that the given flags make (``values``: option parameter -> value; ``None``, an
    empty list and an absent switch give nothing)."""
    out: dict[str, Any] = {}
    for f in flags:
        value = values.get(f.param)
        if f.switch is not None:
            value = f.switch if value else None
        elif value in (None, []):
            value = None
        elif f.parse is not None:
            value = f.parse(value)
        if value is None:
            continue
        set_dotted(out, f.setting, value)
    return out


def task_columns(values: list[str]) -> dict[str, str]:
    """``--task-column FIELD=COLUMN`` values as ``task_columns``; a malformed one is a :class:`SettingError`."""
    out: dict[str, str] = {}
    for value in values:
        field, sep, column = value.partition("=")
        if not sep or not field.strip() or not column.strip():
            raise SettingError(f"--task-column {value!r}: expected FIELD=COLUMN (the task field, then the source's "
                               "column), e.g. --task-column question=prompt")
        out[field.strip()] = column.strip()
    return out


MODEL_FLAGS = (
    Flag("model"),
    Flag("tool_parser"),
    Flag("chat_template"),
    Flag("endpoints", "--endpoint"),
)
"""What every command that talks to a model takes (run settings)."""

DOCTOR = MODEL_FLAGS[:3]
"""``agentrl doctor``: the model and how its turns are rendered and parsed."""

TRAIN = (
    Flag("env"),
    *MODEL_FLAGS,
    Flag("name"),
    Flag("steps"),
    Flag("tasks"),
    Flag("tasks_split"),
    Flag("eval_tasks"),
    Flag("eval_tasks_split"),
    Flag("task_columns", "--task-column", parse=task_columns, metavar="FIELD=COLUMN"),
    Flag("nproc"),
    Flag("env_url"),
    Flag("time_limit_min"),
    Flag("mode"),
    Flag("pipeline.max_staleness"),
    Flag("sampling.temperature"),
    Flag("sampling.max_context_tokens"),
    Flag("seed"),
    Flag("trainer.lr"),
    Flag("trainer.lora", "--full", switch=False,
         help="Fine-tune every weight (trainer.lora = false) instead of a LoRA adapter."),
    Flag("agent.command", "--agent", parse=shlex.split),
    Flag("agent.reward", "--agent-reward"),
    Flag("agent.image", "--agent-image"),
    Flag("placement.inference_gpus"),
    Flag("placement.trainer_gpus"),
    Flag("tracking.report_to", parse=str),  # one text, comma-separated
)
"""``agentrl train``: settings of :class:`agentrl.config.run.RunConfig`."""

EVAL = (
    Flag("env"),
    *MODEL_FLAGS,
    Flag("eval_tasks", "--tasks"),
    Flag("eval_tasks_split", "--tasks-split"),
    Flag("task_columns", "--task-column", parse=task_columns, metavar="FIELD=COLUMN"),
    Flag("sampling.max_context_tokens"),
)
"""``agentrl eval``: settings of :class:`agentrl.config.run.RunConfig`."""

POLICY = (
    Flag("host"),
    Flag("port"),
    Flag("token", envvar="AGENTRL_POLICY_TOKEN"),
    Flag("episode_ttl_s", "--episode-ttl"),
    Flag("max_context_tokens"),
)
"""``agentrl serve-policy``: settings of :class:`agentrl.config.policy.PolicyConfig`."""

TINKER = (
    Flag("model"),
    Flag("model_name"),
    Flag("host"),
    Flag("port"),
    Flag("max_adapters"),
    Flag("max_rank"),
    Flag("api_keys"),
    Flag("dir"),
    Flag("max_model_len"),
    Flag("seq_gap_timeout_s", "--seq-gap-timeout"),
)
"""``agentrl serve-tinker``: settings of :class:`agentrl.config.tinker.TinkerConfig`."""

SERVE_ENV = (
    Flag("envs", "--env"),
    Flag("host"),
    Flag("port"),
    Flag("token", envvar="AGENTRL_ENV_TOKEN"),
    Flag("auth", "--no-auth", switch=False, help="No token (only on a loopback address)."),
    Flag("max_sessions"),
    Flag("max_sessions_per_client"),
    Flag("session_ttl_s", "--session-ttl"),
    Flag("step_timeout_s", "--step-timeout"),
    Flag("tokenizers", "--tokenizer"),
    Flag("chat_template"),
)
"""``agentrl serve-env``: settings of :class:`agentrl.config.server.ServerConfig`."""
