"""A training run: the inference stack, the trainer process, evaluations, checkpoints and metrics
around the :class:`~agentrl.orchestrator.loop.Orchestrator` loop (``mode = "sync"`` or ``"async"``).

:class:`TrainingRun` is the run's composition root, in two steps: constructing it only checks and plans
(no network I/O; of the disk, only the model's ``config.json``, whose MoE shape settles the weight-sync
transport), :meth:`TrainingRun.open` loads and claims what the run needs (:class:`RunResources`), and
:meth:`TrainingRun.run` opens it if nobody did, then starts the processes and trains.

Each step is timed; the trainer's idle fraction (time not spent in ``train``) and the engine's idle
fraction (time with no rollout in flight) are the numbers the async mode exists to shrink.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config.facts import model_moe
from agentrl.config.run import RunConfig
from agentrl.config.sync import why_chosen
from agentrl.core.errors import AgentRLError
from agentrl.core.utils import heap
from agentrl.core.utils.atomic import write_atomic
from agentrl.core.utils.race import unless_set
from agentrl.core.versions import PolicyVersion
from agentrl.environment.base import Environment, Task, run_scope
from agentrl.environment.registry import load_env
from agentrl.environment.tasks import load_tasks, task_rng
from agentrl.inference.client import NoEnginesError
from agentrl.inference.watch import EnginesLost, EngineWatch
from agentrl.launch.described import write_description
from agentrl.launch.doctor import check_model
from agentrl.launch.placement import Plan, plan_run
from agentrl.launch.stack import (
    InferenceStack,
    check_sampling_logprobs,
    enable_sampling_masks,
    ensure_model,
    inference_stack,
)
from agentrl.moe.families import MoEInfo
from agentrl.orchestrator.budget import TrainingClock
from agentrl.orchestrator.evaluate import evaluate
from agentrl.orchestrator.loop import Orchestrator
from agentrl.orchestrator.metrics import (
    MetricsWriter,
    plot_pipeline,
    plot_run,
    read_jsonl,
    supersede_after,
    train_record,
)
from agentrl.orchestrator.moe import routing_template
from agentrl.orchestrator.parts import EngineControl, EpisodeRunner, RunTrainer
from agentrl.orchestrator.rundir import open_run
from agentrl.rollout import templates
from agentrl.rollout.groups import RolloutWorkers
from agentrl.tracking.base import TrackerContext
from agentrl.tracking.card import write_model_card
from agentrl.tracking.hub import TrackerHub
from agentrl.tracking.samples import TABLE_COLUMNS, sample_rows, table_rows, write_samples
from agentrl.weight_sync.base import Engines, Publisher, PublishTarget
from agentrl.weight_sync.registry import open_publisher

log = logging.getLogger(__name__)


class RunNotOpen(AgentRLError, RuntimeError):
    """A part of a :class:`TrainingRun` that :meth:`TrainingRun.open` loads was asked for before it ran."""

    code = "orchestrator.run_not_open"


def _latest_checkpoint(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The run's latest complete checkpoint and its ``state.json`` (step, version); None: there is none."""
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    done = [c for c in ckpts if (c / "state.json").is_file()]
    return (done[-1], json.loads((done[-1] / "state.json").read_text())) if done else None


@dataclass(frozen=True)
class RunResources:
    """What :meth:`TrainingRun.open` loaded and claimed: everything of a run that takes disk or network I/O
    before any process starts."""

    cfg: RunConfig
    """The run's config: resolved (its weight-sync transport settled), and its name settled by the run
    directory."""
    run_id: str
    moe: MoEInfo | None
    """The model's MoE shape (None: dense): its runs capture and replay expert routing."""
    env_cls: type[Environment]
    train_tasks: list[Task]
    eval_tasks: list[Task]
    resume_from: tuple[Path, dict[str, Any]] | None
    """``--resume``: the checkpoint this run continues from and its state (None: a new run, or none yet)."""
    trackers: TrackerHub
    """The run's experiment trackers (``tracking.report_to``), fed every ``metrics.jsonl`` record."""
    metrics: MetricsWriter

    @property
    def run_dir(self) -> Path:
        """The run's directory (claimed for a new run, checked for a resumed one)."""
        return self.cfg.run_dir


class TrainingRun:
    """One training run (see module docstring). Use ``await TrainingRun(cfg).run()``; to read the run's
    directory, tasks or metrics before it starts, ``run = await TrainingRun(cfg).open()`` first.

    Construction does no network I/O and reads nothing on disk but the model's ``config.json``. It raises a
    ``ValueError`` when the config cannot train correctly (e.g. greedy sampling) and a ``PlacementError`` for an
    impossible placement plan. :meth:`open`
    raises for what it loads: an unknown environment or unreachable env server, a missing task file, a run
    directory that holds another run (``RunDirError``).
    """

    def __init__(self, cfg: RunConfig, *, resume: bool = False, progress: bool = True) -> None:
        cfg.check_trainable()
        self.cfg = cfg.resolved()
        """The run's config: resolved; after :meth:`open`, also its MoE plan and run name settled."""
        self.resume = resume
        self.progress = progress
        self.plan: Plan = plan_run(self.cfg)
        """Where every process goes, decided before anything starts (raises for an impossible plan)."""
        self.version = PolicyVersion(0)
        """The policy version's one owner, for the whole run: restored on resume, bumped by the
        orchestrator after each update, read by everything else (through :meth:`policy_version`)."""
        self.orch: Orchestrator | None = None
        self.step = 0
        self._resources: RunResources | None = None
        self._stop_after: int | None = None

    def stop_after(self, step: int) -> None:
        """End the run once ``step`` steps are done (never later than ``cfg.steps``), read between steps: how
        a driver (a bench, a controller) ends a run early without touching its config, which is frozen."""
        self._stop_after = step if self._stop_after is None else min(self._stop_after, step)

    def _last_step(self) -> int:
        return self.cfg.steps if self._stop_after is None else min(self.cfg.steps, self._stop_after)

    async def open(self) -> TrainingRun:
        """Load and claim what the run needs (:class:`RunResources`), once: the model's MoE shape, the
        environment (an ``env_url`` contacts its server), the train and eval tasks, the run directory (claimed,
        or checked on resume), the checkpoint to resume from, the trackers and the metrics file. Returns the
        run; later calls do nothing. :meth:`run` calls it first."""
        if self._resources is None:
            self._resources = await asyncio.to_thread(self._load)
            self.cfg = self._resources.cfg
        return self

    def _load(self) -> RunResources:
        """:meth:`open`'s blocking part, in the order a failure must stop it: nothing is claimed on disk before
        the environment and the tasks have loaded."""
        moe = model_moe(self.cfg.model)
        cfg = self.cfg
        log.info(why_chosen(cfg.transport, cfg.served()))
        env_cls = load_env(cfg.env, url=cfg.env_url, token=cfg.env_token)
        train_tasks = load_tasks(env_cls, "train", cfg.tasks, source_split=cfg.tasks_split, columns=cfg.task_columns)
        eval_tasks = load_tasks(env_cls, "test", cfg.eval_tasks, source_split=cfg.eval_tasks_split,
                                columns=cfg.task_columns)[: cfg.eval_size]
        # the run directory: a fresh one claimed for this run, or the checked one being resumed
        cfg, run_id = open_run(cfg, resume=self.resume)
        resume_from = _latest_checkpoint(cfg.run_dir) if self.resume else None
        resume_step = (int(resume_from[1]["step"]) if resume_from else 0) if self.resume else None
        tracking = cfg.tracking
        trackers = TrackerHub(tracking.report_to, TrackerContext(
            run_dir=cfg.run_dir, run_name=cfg.run_dir.name, run_id=run_id, project=tracking.project,
            config=cfg.model_dump(mode="json"), resume_step=resume_step), close_timeout_s=tracking.close_timeout_s)
        metrics = MetricsWriter(cfg.run_dir / "metrics.jsonl", run_id, sink=trackers.log_record if trackers else None)
        return RunResources(cfg=cfg, run_id=run_id, moe=moe, env_cls=env_cls, train_tasks=train_tasks,
                            eval_tasks=eval_tasks, resume_from=resume_from, trackers=trackers, metrics=metrics)

    # ----------------------------------------------------------------- what open() loaded
    @property
    def resources(self) -> RunResources:
        """What :meth:`open` loaded; raises :class:`RunNotOpen` before it ran."""
        if self._resources is None:
            raise RunNotOpen("the run is not open yet: await run.open() (run() does it first)")
        return self._resources

    @property
    def run_dir(self) -> Path:
        """The run's directory (:meth:`open` claims it)."""
        return self.resources.run_dir

    @property
    def run_id(self) -> str:
        """The run's id (``run.json``)."""
        return self.resources.run_id

    @property
    def moe(self) -> MoEInfo | None:
        """The model's MoE shape (None: dense)."""
        return self.resources.moe

    @property
    def env_cls(self) -> type[Environment]:
        """The run's environment class."""
        return self.resources.env_cls

    @property
    def train_tasks(self) -> list[Task]:
        """The tasks training samples from."""
        return self.resources.train_tasks

    @property
    def eval_tasks(self) -> list[Task]:
        """The held-out tasks of every evaluation (at most ``eval_size``)."""
        return self.resources.eval_tasks

    @property
    def resume_from(self) -> tuple[Path, dict[str, Any]] | None:
        """``--resume``: the checkpoint this run continues from and its state (None: a new run, or none yet)."""
        return self.resources.resume_from

    @property
    def trackers(self) -> TrackerHub:
        """The run's experiment trackers."""
        return self.resources.trackers

    @property
    def metrics(self) -> MetricsWriter:
        """The run's ``metrics.jsonl``."""
        return self.resources.metrics

    async def run(self) -> dict[str, Any]:
        """Train for ``cfg.steps`` steps (or the time limit); returns a summary (also ``summary.json``). Opens
        the run first (:meth:`open`) unless it is open. The trackers run from the start to the end, and are
        closed however the run ends."""
        await self.open()
        self.trackers.start()
        try:
            summary = await self._run()
        finally:
            status = await asyncio.to_thread(self.trackers.close)
        summary["trackers"] = status
        write_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        return summary

    async def _run(self) -> dict[str, Any]:
        """Start the inference stack and the trainer, evaluate, train, evaluate again and save the policy."""
        from agentrl.trainer.client import TrainerProcess

        cfg = self.cfg
        # the checks of `agentrl doctor`: a model whose turns cannot be stopped, parsed or extended
        # token-faithfully is refused before anything starts
        await asyncio.to_thread(ensure_model, cfg.model)
        await asyncio.to_thread(check_model, cfg.model, cfg.tool_parser, cfg.chat_template)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.run_dir / "config.json", cfg.model_dump_json(indent=2))
        t_start = time.perf_counter()
        # run_scope: the environment's shared resources (e.g. a sandbox pool), cleaned up on every exit
        async with run_scope(self.env_cls, cfg.name), inference_stack(cfg, self.run_dir, self.plan) as stack, \
                contextlib.AsyncExitStack() as stack_ctx:
            await check_sampling_logprobs(stack, cfg)
            await enable_sampling_masks(stack, cfg, len(stack.chat.tokenizer))
            routing = await routing_template(stack.client, self.moe, cfg.trainer.routing_replay)
            placed = self.plan.trainer
            trainer = TrainerProcess(cfg.trainer_config(), self.run_dir, nproc=placed.nproc, env=placed.env)
            await asyncio.to_thread(trainer.start)
            try:
                await self._maybe_resume(trainer)
                publisher = await stack_ctx.enter_async_context(self._publisher(trainer, stack.client))
                # creates the engines' LoRA slots; full weights: the trainer's (a resumed run's) into the engines
                await publisher.publish(self.version.value)
                health = cfg.engine_health
                # an engine brought back gets the trainer's weights, labelled with their version
                watch = EngineWatch(stack.client, lambda url, version: self._republish(trainer, url, version),
                                    lambda: self.version.weights, interval_s=health.interval_s,
                                    lost_after_s=health.lost_after_s, health_timeout_s=health.timeout_s,
                                    failures_to_drop=health.failures_to_drop)
                watch_task = asyncio.create_task(watch.run(), name="engine-watch")
                stack_ctx.callback(watch_task.cancel)
                workers = RolloutWorkers(
                    self.env_cls, stack.client, stack.chat, cfg.sampling,
                    max_concurrency=cfg.max_concurrency, model=cfg.policy_model,
                    policy_version=self.policy_version, routing=routing,
                    sampling_masks=cfg.sampling.truncates,
                )
                if cfg.agent.command:  # black-box training: the agent program drives the episodes
                    from agentrl.http.policy.blackbox import blackbox_runner

                    workers = await stack_ctx.enter_async_context(blackbox_runner(
                        cfg, stack.client, stack.chat, self.policy_version, self.env_cls, self.run_id, routing))
                log.info("start-up heap frozen: %d objects kept out of garbage collections", heap.freeze_heap())
                if self.step == 0:  # a resumed run has no step-0 evaluation to warm the engine up for
                    if cfg.engine_warmup:
                        await self._warm_up(stack)
                    await self._evaluate(workers)
                try:
                    await self._loop(trainer, publisher, stack.client, workers, t_start, watch)
                except EnginesLost as e:
                    await self._checkpoint(trainer)
                    raise EnginesLost(f"{e}; the run stopped after step {self.step} and saved a checkpoint: "
                                      "start the engines again and continue with --resume") from None
                last = await self._evaluate(workers)
                await trainer.save_adapter(cfg.final_policy_dir)
                templates.carry(cfg.final_policy_dir, cfg.chat_template)  # serving it renders as training did
            finally:
                await asyncio.to_thread(trainer.close)
        return self._finish(last, t_start)

    def _finish(self, last: dict[str, float], t_start: float) -> dict[str, Any]:
        """After the processes stopped: the reward curve, the model card and the run's summary (``last``: the
        final evaluation)."""
        cfg = self.cfg
        plot_run(self.metrics.path, self.run_dir / "reward_curve.png", self.run_id)
        # every evaluation of this run, a resumed run's earlier starts included: the first is its step 0
        evals = sorted((r for r in read_jsonl(self.metrics.path) if r.get("kind") == "eval"
                        and r.get("run_id", self.run_id) == self.run_id), key=lambda r: r["step"])
        summary = {
            "run_dir": str(self.run_dir),
            "steps": self.step,
            "success_before": evals[0]["success"] if evals else None,
            "success_after": last["success"],
            "wall_s": time.perf_counter() - t_start,
        }
        figures = {"first_eval": evals[0] if evals else None, "last_eval": evals[-1] if evals else None,
                   "steps": self.step, "wall_s": summary["wall_s"], "run_id": self.run_id}
        write_model_card(cfg.final_policy_dir, cfg, **figures)
        # what serves it as trained (base, template, parser, window, sampling): `agentrl eval --adapter DIR` alone
        write_description(cfg.final_policy_dir, cfg, **figures)
        return summary

    def _maybe_sample(self, batch: list[Any]) -> None:
        """After the first step, every ``tracking.samples_every`` steps and the last: a sample of the step's
        episodes to ``samples/step_N.jsonl`` and to the trackers' tables."""
        every, step = self.cfg.tracking.samples_every, self.step
        if not every or not batch or not (step == 1 or step % every == 0 or step == self.cfg.steps):
            return
        s = self.cfg.sampling
        rows = sample_rows(batch, step=step, k=self.cfg.tracking.samples_per_step, seed=self.cfg.seed,
                           sampling={"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p})
        write_samples(self.run_dir, step, rows)
        self.trackers.log_table(step, "samples/train", TABLE_COLUMNS, table_rows(rows))

    def policy_version(self) -> int:
        """The current policy version."""
        return self.version.value

    async def _maybe_resume(self, trainer: RunTrainer) -> None:
        if not self.resume:
            return
        if self.resume_from is None:
            log.warning("--resume: no checkpoint in %s, starting from scratch", self.run_dir)
            moved = supersede_after(self.metrics.path, -1)
        else:
            ckpt, state = self.resume_from
            await trainer.load_checkpoint(ckpt)
            self.step = int(state["step"])
            self.version.advance(int(state["version"]))
            moved = supersede_after(self.metrics.path, self.step)
            log.info("resumed from %s (step %d)", ckpt, self.step)
        if moved:
            log.info("--resume: %d metric records of the interrupted steps moved to metrics.superseded.jsonl", moved)

    async def _checkpoint(self, trainer: RunTrainer) -> None:
        path = self.run_dir / "checkpoints" / f"step_{self.step:06d}"
        await trainer.save_checkpoint(path)
        # written last, atomically: a checkpoint without it is incomplete and never resumed from
        write_atomic(path / "state.json", json.dumps({"step": self.step, "version": self.policy_version()}))

    async def _warm_up(self, stack: InferenceStack) -> None:
        from agentrl.inference.warmup import warm_up

        context = self.cfg.sampling.max_context_tokens
        rec = await warm_up(stack.client, model=self.cfg.policy_model, concurrency=self.cfg.max_concurrency,
                            vocab_size=stack.chat.tokenizer.vocab_size, max_prompt_tokens=min(256, context // 2),
                            max_tokens=min(32, context // 4))
        log.info("engine warm-up: %.1fs", rec["warmup_s"])
        self.metrics.write({"kind": "warmup", "step": self.step, **rec})

    async def _evaluate(self, workers: EpisodeRunner) -> dict[str, float]:
        t0 = time.perf_counter()
        result = await evaluate(workers, self.eval_tasks, temperature=self.cfg.eval_temperature)
        rec = {"kind": "eval", "step": self.step, "version": self.policy_version(), **result,
               "eval_s": time.perf_counter() - t0}
        self.metrics.write(rec)
        return result

    def _publisher(self, trainer: RunTrainer, client: Engines) -> contextlib.AbstractAsyncContextManager[Publisher]:
        """The run's weight publisher over ``client``'s engines: its settled transport's
        (:mod:`agentrl.weight_sync.registry`)."""
        cfg = self.cfg
        return open_publisher(cfg.transport, PublishTarget(
            trainer, client, adapter_name=cfg.adapter_name, adapter_dir=self.run_dir / "adapters",
            b_scale=cfg.trainer.lora_alpha / cfg.trainer.lora_rank))

    async def _republish(self, trainer: RunTrainer, url: str, version: int) -> None:
        """Give the engine at ``url`` (out of rotation, healthy again) policy ``version``: its LoRA slot,
        weights and label, through the path its host needs (a client of its own: it is not in rotation)."""
        from agentrl.inference.client import InferenceClient

        cfg = self.cfg
        async with InferenceClient([url], model=cfg.inference.served_model_name,
                                   timeout_s=cfg.engine_health.request_timeout_s) as one, \
                self._publisher(trainer, one) as pub:
            await pub.publish(version)

    async def _step(self, orch: Orchestrator, watch: EngineWatch) -> tuple[dict[str, Any], int, int]:
        """One orchestrator step, abandoned if every engine is lost; engines that came back rejoin after it.
        Its metrics, the engines that rejoined and those in rotation."""
        step = await unless_set(watch.lost, orch.step())
        if step is None:
            raise EnginesLost(f"no inference engine has been in rotation for {watch.lost_after_s:.0f}s "
                              f"({watch.describe()})")
        try:
            rec = step.result()
        except NoEnginesError as e:  # the weight update found no engine left: the step's update is lost
            raise EnginesLost(f"the weight update of step {self.step + 1} found no inference engine in rotation "
                              f"({e})") from None
        rejoined = len(await watch.rejoin(orch.version))
        return rec, rejoined, len(watch.client.pool.live)

    async def _loop(self, trainer: RunTrainer, publisher: Publisher, engine: EngineControl,
                    workers: EpisodeRunner, t_start: float, watch: EngineWatch) -> None:
        from tqdm.auto import tqdm

        cfg = self.cfg
        rng = task_rng(cfg.seed, self.step)
        self.orch = orch = Orchestrator(
            runner=workers, trainer=trainer, publisher=publisher, engine=engine,
            sample_task=lambda: rng.choice(self.train_tasks), pipeline=cfg.pipeline,
            groups_per_step=cfg.tasks_per_step, group_size=cfg.group_size, version=self.version,
            normalize_std=cfg.trainer.loss.adv_std_normalize, keep_failed=cfg.keep_failed,
            engines_back=watch.wait_back,
            max_skips_per_step=(round(cfg.max_skips_per_step * cfg.tasks_per_step) if cfg.skip_uniform_groups
                                else 0),
        )
        bar = tqdm(total=cfg.steps, initial=self.step, desc=f"train ({cfg.mode})", disable=not self.progress,
                   unit="step")
        eval_s = 0.0
        loop_t0 = plotted = time.perf_counter()

        def trained_s() -> float:  # wall_train_s: training loop time, without start-up and evaluations
            return time.perf_counter() - loop_t0 - eval_s

        clock = TrainingClock(cfg.time_limit_min * 60 if cfg.time_limit_min else None)
        try:
            async with orch:
                while self.step < self._last_step():
                    if why := clock.why_stop(trained_s()):
                        log.info("stopping before step %d: %s", self.step + 1, why)
                        break
                    rec, rejoined, live = await self._step(orch, watch)
                    self.step += 1
                    self.metrics.write(train_record(
                        rec, step=self.step, version=orch.version, mode=cfg.mode, engines_rejoined=rejoined,
                        engines_live=live, wall_s=time.perf_counter() - t_start, wall_train_s=trained_s()))
                    bar.update(1)
                    self._maybe_sample(orch.last_batch)
                    bar.set_postfix(reward=f"{rec['reward_mean']:.2f}", wait=f"{rec['wait_s']:.1f}s",
                                    train=f"{rec['train_s']:.1f}s")
                    if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                        t = time.perf_counter()
                        await self._evaluate(workers)
                        eval_s += time.perf_counter() - t
                    if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                        await self._checkpoint(trainer)
                    clock.step_done(trained_s())  # a checkpoint counts as its step's
                    if time.perf_counter() - plotted >= cfg.tracking.plot_every_s:  # always drawn at the end
                        plot_run(self.metrics.path, self.run_dir / "reward_curve.png", self.run_id)
                        plotted = time.perf_counter()
        finally:
            bar.close()
            self.orch = None
            # the books of every group after the orchestrator stopped (its in-flight groups were cancelled
            # and released): admitted = consumed + dropped + released + buffered, nothing lost unrecorded
            b = orch.buffer.stats()
            self.metrics.write({"kind": "groups", "step": self.step, "failed_groups": orch.failed_groups,
                                **{f"groups_{k}": b[k] for k in ("admitted", "consumed", "released", "dropped_stale",
                                                                  "dropped_capacity", "in_flight", "buffered")}})
        plot_pipeline(self.metrics.path, self.run_dir / "pipeline.png")
