"""What a saved policy describes: the base model, chat template, tool parser, window and sampling it was
trained with, so that ``agentrl eval --adapter DIR`` (and ``serve-policy``, ``serve-env``, ``export``) serves
it as training did with no other flag.

A finished run writes :data:`POLICY_FILE` into its saved policy (``final_adapter`` or ``final_model``): the
run's resolved config, the fingerprint of the base model (:mod:`agentrl.launch.fit`), and its figures (held-out
success before and after, steps). :func:`read_policy` accepts that directory, its run directory, or a policy
saved before the file existed: it then reads the run's ``config.json`` and ``metrics.jsonl`` beside it, or at
least the adapter's own ``adapter_config.json`` (its base model) and carried chat template.

The settings it gives (:meth:`SavedPolicy.overrides`) go under a config file's and the command line's: a
flag still wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentrl.config.presets import set_dotted
from agentrl.core.errors import ConfigError
from agentrl.core.utils.atomic import write_atomic
from agentrl.launch.fit import adapter_config, check_fits, fingerprint
from agentrl.rollout.templates import carried

if TYPE_CHECKING:  # pragma: no cover
    from agentrl.config.run import RunConfig

POLICY_FILE = "agentrl_policy.json"
"""The description a saved policy carries (written by the run that trained it)."""

SERVED = ("model", "tool_parser", "chat_template", "sampling.temperature", "sampling.top_p", "sampling.top_k",
          "sampling.min_p", "sampling.max_context_tokens", "sampling.max_parse_errors", "inference.max_model_len",
          "inference.dtype")
"""The settings that serve a policy as it was trained: base model, rendering, parsing, window, sampling."""

EVALUATED = (*SERVED, "env", "eval_tasks", "eval_tasks_split", "task_columns", "eval_temperature")
"""``agentrl eval``'s settings: what serves it, and the held-out tasks the run evaluated on."""

_RUN_FILES = ("run.json", "config.json")
"""What marks a run directory (``agentrl.orchestrator.rundir``): its identity and its resolved config."""


class NotAPolicy(ConfigError, ValueError):
    """A path given as a saved policy is none: not an adapter, a model or a run directory that holds one."""

    code = "config.not_a_policy"


@dataclass(frozen=True)
class SavedPolicy:
    """A saved policy and what describes it."""

    path: Path
    """The policy's directory: a peft adapter, or a whole model (a full-weight run's ``final_model``)."""
    kind: Literal["adapter", "model"]
    """``adapter``: served on its base model; ``model``: served as the model itself."""
    config: dict[str, Any] = field(default_factory=dict)
    """The resolved config of the run that trained it (JSON; empty: nothing describes the run)."""
    base: str | None = None
    """The model an adapter was trained on (None for a whole model, or an adapter that names none)."""
    base_digest: str | None = None
    """The fingerprint of ``base`` at training time (None: not recorded)."""
    figures: dict[str, Any] = field(default_factory=dict)
    """The run's figures: ``first_eval``, ``last_eval`` (eval records), ``steps``, ``wall_s``, ``run_id``."""
    source: str = ""
    """What described it: the policy's own file, the run's ``config.json``, or the adapter's config."""

    def settings(self, names: tuple[str, ...] = SERVED) -> dict[str, Any]:
        """The dotted settings of ``names`` it describes; for an adapter also its LoRA shape (which sizes
        the engines' slots). A whole model is its own ``model``."""
        out = {name: value for name in names if (value := _dotted(self.config, name)) is not None}
        if self.kind == "model":
            out["model"] = str(self.path)
        elif self.base is not None:
            out["model"] = self.base
        template = carried(self.path)
        if template is not None:
            out["chat_template"] = template  # the file it carries: the same text, wherever the run ran
        out = {k: v for k, v in out.items() if k in names}
        if self.kind == "adapter":
            peft = adapter_config(self.path)
            out["trainer.lora_rank"], out["trainer.lora_alpha"] = int(peft["r"]), float(peft["lora_alpha"])
        return out

    def overrides(self, names: tuple[str, ...] = SERVED) -> dict[str, Any]:
        """:meth:`settings` as nested tables, for ``load_config``'s layer under the file and the flags."""
        out: dict[str, Any] = {}
        for setting, value in self.settings(names).items():
            set_dotted(out, setting, value)
        return out

    def check_base(self, model: str) -> None:
        """Refuse (``BaseMismatch``) a base ``model`` this adapter does not fit; nothing for a whole model."""
        if self.kind == "adapter":
            check_fits(self.path, model, trained_on=self.base, digest=self.base_digest)


def _dotted(table: dict[str, Any], setting: str) -> Any:
    for name in setting.split("."):
        if not isinstance(table, dict):
            return None
        table = table.get(name)  # type: ignore[assignment]
    return table


def _locate(path: Path) -> tuple[Path, Literal["adapter", "model"]]:
    """The policy directory ``path`` names, and its kind."""
    if (path / "adapter_config.json").is_file():
        return path, "adapter"
    for name, kind in (("final_adapter", "adapter"), ("final_model", "model")):
        if (path / name).is_dir():
            return _locate(path / name)[0], kind  # type: ignore[return-value]
    if (path / "config.json").is_file() and not (path / _RUN_FILES[0]).is_file():
        return path, "model"
    raise NotAPolicy(f"{path} holds no saved policy: expected a LoRA adapter (adapter_config.json), a model "
                     "directory (config.json), or a run directory with final_adapter or final_model")


def _run_dir_of(policy: Path) -> Path | None:
    run = policy.resolve().parent
    return run if all((run / name).is_file() for name in _RUN_FILES) else None


def read_policy(path: str | Path) -> SavedPolicy:
    """What describes the saved policy at ``path`` (an adapter, a whole model, or a run directory): its own
    :data:`POLICY_FILE`, else its run's ``config.json`` and metrics, else the adapter's ``adapter_config.json``.
    Raises :class:`NotAPolicy` for a path that holds none."""
    path = Path(path)
    if not path.is_dir():
        raise NotAPolicy(f"{path} is not a directory: expected a saved adapter, model or run directory")
    policy, kind = _locate(path)
    peft_base = adapter_config(policy).get("base_model_name_or_path") if kind == "adapter" else None
    record = policy / POLICY_FILE
    if record.is_file():
        data = json.loads(record.read_text())
        base = _existing(data["base"].get("model"), data["base"].get("path")) if kind == "adapter" else None
        return SavedPolicy(policy, kind, data["config"], base, data["base"].get("digest"), data.get("figures", {}),
                           source=str(record))
    run = _run_dir_of(policy)
    if run is not None:
        config = json.loads((run / "config.json").read_text())
        base = _existing(config.get("model"), peft_base) if kind == "adapter" else None
        return SavedPolicy(policy, kind, config, base, None, run_figures(run), source=str(run / "config.json"))
    return SavedPolicy(policy, kind, {}, peft_base, source=str(policy / "adapter_config.json") if peft_base else "")


def _existing(*candidates: str | None) -> str | None:
    """The first candidate that is a directory here, else the first one given (a hub id, or gone)."""
    given = [c for c in candidates if c]
    return next((c for c in given if Path(c).is_dir()), given[0] if given else None)


def run_figures(run_dir: Path) -> dict[str, Any]:
    """A run directory's figures from its ``metrics.jsonl`` and ``summary.json``: its first and last
    evaluation, steps, wall time and run id (what it has of them)."""
    ident = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else {}
    run_id = ident.get("run_id")
    evals: list[dict[str, Any]] = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            rec = json.loads(line) if line.strip() else {}
            if rec.get("kind") == "eval" and rec.get("run_id", run_id) == run_id:
                evals.append(rec)
    evals.sort(key=lambda r: r["step"])
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    return {"first_eval": evals[0] if evals else None, "last_eval": evals[-1] if evals else None,
            "steps": summary.get("steps", evals[-1]["step"] if evals else None), "wall_s": summary.get("wall_s"),
            "run_id": run_id}


def describe(cfg: RunConfig, **figures: Any) -> dict[str, Any]:
    """The :data:`POLICY_FILE` record of the policy a run of ``cfg`` saved, with its ``figures``."""
    model = Path(cfg.model)
    return {"format": 1, "kind": "adapter" if cfg.trainer.lora else "model",
            "base": {"model": cfg.model, "path": str(model.resolve()) if model.is_dir() else None,
                     "digest": fingerprint(model)},
            "config": cfg.model_dump(mode="json"), "figures": figures}


def write_description(policy_dir: Path, cfg: RunConfig, **figures: Any) -> Path:
    """Write :func:`describe`'s record into the saved policy ``policy_dir``; returns its path."""
    path = Path(policy_dir) / POLICY_FILE
    write_atomic(path, json.dumps(describe(cfg, **figures), indent=2, default=str))
    return path


def served_as_trained(cfg: RunConfig, adapter: str | Path) -> dict[str, object]:
    """The settings that serve the saved ``adapter`` as the run that trained it: a LoRA run whose tensors trained
    whole, and output-layer LoRA, are the ones it carries (the transport is then settled by the config's one
    rule, and the engines wrap the output layer where it has one), and the chat
    template it was trained with, when it carries one and ``cfg`` names none."""
    from agentrl.weight_sync.saved import carries_output_lora, carries_whole_tensors

    changes: dict[str, object] = {"trainer.lora": True, "trainer.lora_train_norms": False,
                                  "trainer.lora_train_embedding": carries_whole_tensors(adapter),
                                  "trainer.lora_train_unembed": carries_output_lora(adapter)}
    if cfg.chat_template is None:
        changes["chat_template"] = carried(adapter)
    return changes


async def publish_saved(cfg: RunConfig, client: Any, adapter: str | Path, adapter_dir: Path) -> None:
    """Publish the saved ``adapter`` into ``client``'s engines through the transport ``cfg`` (changed by
    :func:`served_as_trained`, resolved) settles on: its LoRA slot, or merged into the weights; the engines then
    serve it as ``cfg.policy_model``. ``adapter_dir``: where a file transport writes its copies."""
    from agentrl.weight_sync.base import PublishTarget
    from agentrl.weight_sync.registry import open_publisher
    from agentrl.weight_sync.saved import AdapterDirectory

    target = PublishTarget(AdapterDirectory(adapter), client, adapter_name=cfg.adapter_name, adapter_dir=adapter_dir)
    async with open_publisher(cfg.transport, target) as publisher:
        await publisher.publish(1)
