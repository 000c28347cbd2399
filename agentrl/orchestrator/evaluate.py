"""Held-out evaluation: one episode per task, success = reward >= 1."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.environment.base import Task, run_scope
from agentrl.orchestrator.parts import EpisodeRunner
from agentrl.rollout.stats import summarize


async def evaluate(
    workers: EpisodeRunner, tasks: Sequence[Task], *, temperature: float | None = None
) -> dict[str, Any]:
    """Run every task once and summarise (success rate, mean reward, stop reasons, failures). ``temperature``
    applies to these episodes only: the episodes ``workers`` start meanwhile for training keep theirs."""
    if temperature is not None:
        workers = workers.with_sampling(workers.sampling.model_copy(update={"temperature": temperature}))
    groups = await workers.run_groups(list(tasks), 1)
    return summarize([t for g in groups for t in g])


async def run_eval(cfg: Any, *, adapter: Any = None, n: int = 200, temperature: float = 1.0) -> dict[str, Any]:
    """Start the inference stack for ``cfg`` (a RunConfig), optionally publish ``adapter`` (a saved peft adapter)
    through the transport a run that trained it would settle on (its LoRA slot, or merged into the weights
    when it carries tensors trained whole: :mod:`agentrl.config.sync`), and evaluate on the first ``n``
    held-out tasks, inside the environment's run scope. Without an adapter the model is ``cfg.model`` itself
    (a full-weight run's ``final_model`` directory, for one)."""
    from agentrl.environment.registry import load_env
    from agentrl.environment.tasks import load_tasks
    from agentrl.launch.described import publish_saved, served_as_trained
    from agentrl.launch.stack import inference_stack
    from agentrl.rollout.groups import RolloutWorkers

    if adapter is not None:
        cfg = cfg.with_changes(served_as_trained(cfg, adapter))
    cfg = cfg.resolved()
    env_cls = load_env(cfg.env)
    tasks = load_tasks(env_cls, "test", cfg.eval_tasks, source_split=cfg.eval_tasks_split,
                       columns=cfg.task_columns)[:n]
    async with run_scope(env_cls, f"eval-{env_cls.name or env_cls.__name__}"), inference_stack(cfg, cfg.output_dir / "eval") as stack:
        model = None
        if adapter is not None:
            await publish_saved(cfg, stack.client, adapter, cfg.output_dir / "eval" / "adapters")
            model = cfg.policy_model
        workers = RolloutWorkers(env_cls, stack.client, stack.chat, cfg.sampling, model=model,
                                 max_concurrency=cfg.max_concurrency)
        result = await evaluate(workers, tasks, temperature=temperature)
    result.update({"env": cfg.env, "model": cfg.model, "adapter": str(adapter) if adapter else None,
                   "num_tasks": len(tasks), "temperature": temperature})
    return result

