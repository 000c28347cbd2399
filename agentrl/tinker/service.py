"""The Tinker API's operations, without HTTP: sessions, training models (one adapter each), their requests
in ``seq_id`` order, checkpoints. Each operation takes the caller's owner (:mod:`agentrl.tinker.keys`) and
sees only that owner's things. Requests that the SDK polls for return a :class:`~agentrl.tinker.futures.Future`
at once; the work runs on the trainer's one worker thread."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from agentrl.tinker.checkpoints import Checkpoints
from agentrl.tinker.errors import TinkerError, TinkerGone, TinkerNotFound, TinkerUserError
from agentrl.tinker.futures import Future, Futures
from agentrl.tinker.runs import Runs
from agentrl.tinker.sequencer import Sequencer
from agentrl.tinker.trainer import LoraSpec, LoraTrainer, read_spec
from agentrl.tinker.wire import forward_backward_output, parse_forward_backward

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Session:
    session_id: str
    owner: str
    created: float = field(default_factory=time.time)
    last_heartbeat: float = field(default_factory=time.monotonic)
    finished: str | None = None
    sampler_count: int = 0


@dataclass
class Model:
    model_id: str
    owner: str
    session_id: str
    adapter: str
    """The adapter's name in the trainer (a plain identifier)."""
    spec: LoraSpec
    sequencer: Sequencer
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    failed: str | None = None
    sampler_saves: int = 0
    live_path: str | None = None
    """The model's latest sampler checkpoint, which its live engine adapter serves (updated in place)."""
    user_metadata: dict[str, Any] | None = None
    """What the client created it with (kept in the run's ``run.json``)."""
    last_request: float = field(default_factory=time.time)

    @property
    def live_adapter(self) -> str:
        """The name of the model's live adapter in the sampling engine."""
        return f"live-{self.adapter}"


class TinkerService:
    """Sessions, models and their requests over one trainer; ``model_name`` is the base model's name."""

    def __init__(self, trainer: LoraTrainer, checkpoints: Checkpoints, *, model_name: str, model_dir: Path,
                 max_context: int, gap_timeout_s: float = 120.0) -> None:
        self.trainer = trainer
        self.checkpoints = checkpoints
        self.model_name = model_name
        self.model_dir = model_dir
        self.max_context = max_context
        self.gap_timeout_s = gap_timeout_s
        self.futures = Futures()
        self.runs = Runs(checkpoints)
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        self._creating: dict[str, Future] = {}
        self._adapters = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-trainer")
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` on the trainer's worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, partial(fn, *args, **kwargs))

    def spawn(self, fut: Future, work: Callable[[], Awaitable[None]]) -> Future:
        """Run ``work`` (which settles ``fut``) in the background; a failure fails ``fut``."""
        async def guarded() -> None:
            try:
                await work()
            except TinkerError as e:
                Futures.fail(fut, e)
            except Exception as e:
                log.exception("%s failed", fut.kind)
                Futures.fail(fut, e)
        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return fut

    # sessions -------------------------------------------------------------------------------------------
    def create_session(self, owner: str) -> str:
        sid = uuid.uuid4().hex
        self.sessions[sid] = Session(sid, owner)
        return sid

    def session(self, owner: str, session_id: str, *, live: bool = True) -> Session:
        s = self.sessions.get(session_id)
        if s is None or s.owner != owner:
            raise TinkerNotFound(f"no session {session_id!r} for this API key")
        if live and s.finished:
            raise TinkerGone(f"session {session_id} was finished ({s.finished})")
        return s

    def heartbeat(self, owner: str, session_id: str) -> None:
        self.session(owner, session_id).last_heartbeat = time.monotonic()

    async def finish(self, owner: str, session_id: str, status: str) -> None:
        """Mark the session finished (first reason wins) and free its models' adapters."""
        s = self.session(owner, session_id, live=False)
        if s.finished:
            return
        s.finished = status or "success"
        for model in [m for m in self.models.values() if m.session_id == session_id]:
            await self._drop(model)

    async def expire(self, ttl_s: float) -> list[str]:
        """Finish the sessions without a heartbeat for ``ttl_s`` (their client is gone; the SDK beats every
        10 s) and free their adapters; returns their ids."""
        now = time.monotonic()
        gone = [s for s in self.sessions.values() if not s.finished and now - s.last_heartbeat > ttl_s]
        for s in gone:
            log.info("session %s expired: no heartbeat for %.0f s", s.session_id, now - s.last_heartbeat)
            await self.finish(s.owner, s.session_id, "expired")
        return [s.session_id for s in gone]

    async def _drop(self, model: Model) -> None:
        self.models.pop(model.model_id, None)
        self._creating.pop(model.model_id, None)
        await model.sequencer.close()
        await self.run(self.trainer.remove, model.adapter)

    # models ---------------------------------------------------------------------------------------------
    def model(self, owner: str, model_id: str) -> Model:
        m = self.models.get(model_id)
        if m is None or m.owner != owner:
            raise TinkerNotFound(f"no model {model_id!r} for this API key")
        return m

    def _new_model(self, owner: str, session_id: str, model_seq_id: int, base_model: str | None,
                   spec: LoraSpec, user_metadata: dict[str, Any] | None = None) -> Model:
        self.session(owner, session_id)
        if base_model is not None and base_model != self.model_name:
            raise TinkerUserError(f"base model {base_model!r}: this server serves {self.model_name!r} only")
        self.trainer.check(spec)
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self.models:
            raise TinkerUserError(f"model {model_id} exists already (model_seq_id {model_seq_id} was used)")
        self._adapters += 1
        model = Model(model_id, owner, session_id, f"m{self._adapters}", spec,
                      Sequencer(self.futures, model_id, gap_timeout_s=self.gap_timeout_s), user_metadata=user_metadata)
        self.models[model_id] = model
        return model

    def create_model(self, owner: str, req: Any) -> Future:
        """``POST /api/v1/create_model``: a new adapter; its result is ``{"model_id": ...}``."""
        key = f"{req.session_id}:train:{req.model_seq_id}"
        if key in self._creating and self._creating[key].owner == owner:
            return self._creating[key]  # a retry
        lora = req.lora_config
        spec = LoraSpec(rank=lora.rank, seed=lora.seed, train_mlp=lora.train_mlp, train_attn=lora.train_attn,
                        train_unembed=lora.train_unembed) if lora is not None else LoraSpec()
        if getattr(req.optimizer_config, "type", "adamw") != "adamw":
            raise TinkerUserError(f"optimizer {req.optimizer_config.type!r}: this server trains with AdamW only")
        model = self._new_model(owner, req.session_id, req.model_seq_id, req.base_model, spec,
                                getattr(req, "user_metadata", None))
        fut = self.futures.create(owner, "create_model")
        fut.extra["model_id"] = model.model_id
        self._creating[key] = fut

        async def created() -> None:
            Futures.succeed(fut, json={"model_id": model.model_id, "type": "create_model"})
        return self.spawn(fut, partial(self._make, model, created))

    async def _make(self, model: Model, then: Callable[[], Awaitable[None]]) -> None:
        """Add ``model``'s adapter, then run ``then``; a failure forgets the model. Its requests wait for this."""
        try:
            await self.run(self.trainer.add, model.adapter, model.spec)
            self.runs.record(model.owner, model.model_id, base_model=self.model_name, spec=model.spec,
                             user_metadata=model.user_metadata)
            await then()
        except Exception as e:
            model.failed = str(e)
            self.models.pop(model.model_id, None)
            raise
        finally:
            model.ready.set()

    def last_requests(self, owner: str) -> dict[str, float]:
        """When each of ``owner``'s loaded models last took a request."""
        return {m.model_id: m.last_request for m in self.models.values() if m.owner == owner}

    def training_run(self, owner: str, model_id: str) -> dict[str, Any]:
        """``GET /api/v1/training_runs/{id}``: the SDK's ``TrainingRun`` (a run of an earlier server too)."""
        return self.runs.get(owner, model_id, last_request=self.last_requests(owner).get(model_id))

    def get_info(self, owner: str, model_id: str) -> dict[str, Any]:
        m = self.model(owner, model_id)
        return {"type": "get_info", "model_id": m.model_id, "model_name": self.model_name, "is_lora": True,
                "lora_rank": m.spec.rank, "optimizer_config": {"type": "adamw"},
                "model_data": {"arch": self.trainer.base.config.model_type, "model_name": self.model_name,
                               "tokenizer_id": str(self.model_dir)}}

    def ordered(self, owner: str, model_id: str, seq_id: int | None, kind: str,
                 work: Callable[[Model, Future], Awaitable[None]]) -> Future:
        """Queue ``work`` on the model's sequencer at ``seq_id``."""
        model = self.model(owner, model_id)
        model.last_request = time.time()

        async def job(fut: Future) -> None:
            await model.ready.wait()
            if model.failed:
                raise TinkerUserError(f"model {model_id} could not be created: {model.failed}")
            try:
                await work(model, fut)
            except TinkerError as e:
                Futures.fail(fut, e)
        return model.sequencer.submit(seq_id, owner, kind, job)

    def forward_backward(self, owner: str, body: bytes) -> Future:
        """``POST /api/v1/forward_backward`` (a protobuf body; ``forward_only`` for ``forward``)."""
        req = parse_forward_backward(body)
        longest = max((len(d.tokens) for d in req.data), default=0)
        if longest > self.max_context:
            raise TinkerUserError(f"forward_backward: a datum of {longest} tokens; this server's context is "
                                  f"{self.max_context} tokens (serve-tinker --max-model-len)")

        async def work(model: Model, fut: Future) -> None:
            outputs, metrics = await self.run(self.trainer.forward_backward, model.adapter, req.data, req.loss_fn,
                                              req.loss_fn_config, req.forward_only)
            Futures.succeed(fut, proto=forward_backward_output(outputs, metrics))
        return self.ordered(owner, req.model_id, req.seq_id, "forward" if req.forward_only else "forward_backward",
                             work)

    def optim_step(self, owner: str, req: Any) -> Future:
        params = req.optim_params.model_dump()
        if params.get("type", "adam") not in ("adam", "adamw") and "learning_rate" not in params:
            raise TinkerUserError("optim_step: this server takes AdamParams only")

        async def work(model: Model, fut: Future) -> None:
            metrics = await self.run(self.trainer.optim_step, model.adapter, params)
            Futures.succeed(fut, json={"metrics": metrics})
        return self.ordered(owner, req.model_id, req.seq_id, "optim_step", work)

    def unload_model(self, owner: str, model_id: str) -> Future:
        model = self.model(owner, model_id)
        fut = self.futures.create(owner, "unload_model")

        async def work() -> None:
            await self._drop(model)
            Futures.succeed(fut, json={"model_id": model_id, "type": "unload_model"})
        return self.spawn(fut, work)

    # checkpoints ----------------------------------------------------------------------------------------
    def save_weights(self, owner: str, req: Any) -> Future:
        """``save_state``: the adapter and its optimizer state at ``tinker://MODEL/weights/NAME``."""
        name = req.path or f"state-{int(time.time() * 1000)}"

        async def work(model: Model, fut: Future) -> None:
            ckpt = self.checkpoints.new(owner, model.model_id, "weights", name, overwrite=req.overwrite)
            await self.run(self.trainer.save, model.adapter, ckpt.dir, optimizer=True)
            Checkpoints.seal(ckpt, owner, {"base_model": self.model_name, "optimizer": True,
                                           "user_metadata": req.user_metadata})
            Futures.succeed(fut, json={"path": ckpt.path, "type": "save_weights"})
        return self.ordered(owner, req.model_id, req.seq_id, "save_weights", work)

    def load_weights(self, owner: str, req: Any) -> Future:
        """``load_state(_with_optimizer)`` on a model, or a new model made from a checkpoint (the SDK's
        ``create_training_client_from_state``: ``session_id`` and ``model_seq_id`` instead of ``model_id``)."""
        ckpt = self.checkpoints.find(req.path, owner)
        if req.optimizer and not (ckpt.dir / "optimizer.pt").exists():
            raise TinkerUserError(f"{req.path} holds no optimizer state (it was saved for a sampler): load it "
                                  "without the optimizer")

        async def load(model: Model, fut: Future) -> None:
            await self.run(self.trainer.load, model.adapter, ckpt.dir, optimizer=req.optimizer)
            Futures.succeed(fut, json={"path": ckpt.path, "model_id": model.model_id, "type": "load_weights"})

        if req.model_id is not None:
            return self.ordered(owner, req.model_id, req.seq_id, "load_weights", load)
        if req.session_id is None or req.model_seq_id is None:
            raise TinkerUserError("load_weights: give model_id and seq_id, or session_id and model_seq_id")
        model = self._new_model(owner, req.session_id, req.model_seq_id, req.base_model, read_spec(ckpt.dir),
                                getattr(req, "user_metadata", None))
        fut = self.futures.create(owner, "load_weights")
        return self.spawn(fut, partial(self._make, model, partial(load, model, fut)))
