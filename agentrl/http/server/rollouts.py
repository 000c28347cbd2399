"""Whole rollouts on the server: the in-process agent loop (``run_episode``) against the caller's engine.

The caller names an inference server and a model; the server renders the chat with one of its configured
tokenizers (``ServerConfig.tokenizers``: the chat template must match the served model) and returns the
token-faithful trajectory. The engine must return token ids (vLLM's ``/inference/v1/generate``, or
``/v1/completions`` with ``return_token_ids``); an engine that cannot ends the episode with
``stop_reason: inference_error`` and says why in ``error``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from pathlib import Path
from typing import Any

from agentrl.config.server import ServerConfig
from agentrl.core.types import Trajectory
from agentrl.http.errors import ApiError
from agentrl.http.server.catalog import EnvCatalog
from agentrl.http.server.metrics import Metrics
from agentrl.http.server.protocol import RolloutRequest, RolloutResult

log = logging.getLogger("agentrl.http.server")

NON_FINITE_LOGPROB = -1e9
"""JSON has no infinities: a non-finite logprob (an engine that returned none for a token) is sent as this."""


def finite(traj: Trajectory) -> Trajectory:
    """``traj`` with logprobs JSON can carry (non-finite ones clamped). Rewards and metrics are finite by
    the episode's reward rule."""
    traj.logprobs = [x if math.isfinite(x) else NON_FINITE_LOGPROB for x in traj.logprobs]
    return traj


class RolloutService:
    """Runs ``POST /v1/rollouts`` requests, at most ``max_rollouts`` at once."""

    def __init__(self, config: ServerConfig, catalog: EnvCatalog, metrics: Metrics) -> None:
        self.config = config
        self.catalog = catalog
        self.metrics = metrics
        self.running = 0
        self._chats: dict[tuple[str, str], Any] = {}
        self._load_lock = asyncio.Lock()
        metrics.gauge("agentrl_env_rollouts_running", "Whole rollouts in progress.", lambda: self.running)

    def _tokenizer_name(self, requested: str | None) -> str:
        allowed = self.config.tokenizers
        if not allowed:
            raise ApiError(
                409,
                "this server runs no whole rollouts: it was started without a tokenizer "
                "(agentrl serve-env --tokenizer MODEL_DIR); drive sessions step by step instead",
                code="rollouts_disabled",
            )
        if requested is None:
            return allowed[0]
        for name in allowed:
            if requested in (name, Path(name).name):
                return name
        names = [Path(n).name for n in allowed]
        raise ApiError(422, f"unknown tokenizer {requested[:200]!r}; this server has {names}")

    async def chat_format(self, requested: str | None, tool_parser: str = "hermes") -> Any:
        """The ``ChatFormat`` of a configured tokenizer with a tool parser (loaded once per pair)."""
        from agentrl.rollout.toolcalls import ToolParserError, check_tool_parser_name

        name = self._tokenizer_name(requested)
        try:
            await asyncio.to_thread(check_tool_parser_name, tool_parser)
        except ToolParserError as e:
            raise ApiError(422, str(e), code="unknown_tool_parser") from None
        key = (name, tool_parser)
        async with self._load_lock:
            if key not in self._chats:
                from agentrl.launch.stack import load_chat_format

                try:
                    self._chats[key] = await asyncio.to_thread(load_chat_format, name, tool_parser,
                                                               self.config.chat_template)
                except Exception as e:  # a misconfigured server: say so, do not crash
                    log.warning("cannot load tokenizer %s", name, exc_info=True)
                    raise ApiError(
                        409,
                        f"the server's tokenizer {Path(name).name!r} cannot be loaded: {type(e).__name__}",
                        code="tokenizer_unavailable",
                    ) from None
        return self._chats[key]

    async def run(self, req: RolloutRequest) -> RolloutResult:
        """One episode; inference and environment failures are recorded in the trajectory, not raised."""
        from agentrl.config.run import SamplingConfig
        from agentrl.http.server.session import limits_of
        from agentrl.inference.client import InferenceClient
        from agentrl.rollout.loop import run_episode

        name, cls = self.catalog.resolve(req.env)
        task = self.catalog.task_for(name, req.task_id, req.split, req.task)
        if self.running >= self.config.max_rollouts:
            raise ApiError(
                429,
                f"{self.config.max_rollouts} rollouts are already running; retry later",
                headers={"Retry-After": "1"},
            )
        self.running += 1
        try:
            chat = await self.chat_format(req.tokenizer, req.tool_parser)
            headers = {"Authorization": f"Bearer {req.api_key}"} if req.api_key else None
            client = InferenceClient(
                [req.base_url],
                model=req.model,
                timeout_s=self.config.inference_timeout_s,
                max_retries=2,
                headers=headers,
            )
            try:
                sampling = SamplingConfig(**req.sampling.model_dump())
                routing = await self._routing(client, req.base_url) if req.return_routing else None
                masks = req.return_sampling_mask and sampling.truncates
                if masks:
                    await self._masks(client, req.base_url)
                traj = await run_episode(cls, task, client, chat, sampling, model=req.model,
                                         group_id=req.group_id, limits=limits_of(self.config), routing=routing,
                                         sampling_masks=masks)
            finally:
                await client.aclose()
        finally:
            self.running -= 1
        self.metrics.inc(
            "agentrl_env_rollouts_total",
            "Whole rollouts by environment and stop reason.",
            env=name,
            stop_reason=traj.stop_reason.value,
        )
        return RolloutResult(trajectory=finite(traj))

    @staticmethod
    async def _masks(client: Any, base_url: str) -> None:
        """Turn on ``base_url``'s sampling-mask capture (:class:`ApiError` 422 when it cannot capture)."""
        rec = (await client.enable_mask_capture()).get(base_url) or {}
        if not rec.get("ok"):
            raise ApiError(422, f"return_sampling_mask: the inference server {base_url} cannot record sampling "
                                f"masks: {rec.get('error')}")

    async def _routing(self, client: Any, base_url: str) -> Any:
        """The empty routing of an episode on ``base_url``'s MoE model, capture turned on there first
        (:class:`ApiError` 422 when that engine cannot capture routing)."""
        from agentrl.core.types import Routing

        rec = (await client.enable_routing_capture()).get(base_url) or {}
        if not rec.get("ok"):
            raise ApiError(422, f"return_routing: the inference server {base_url} cannot capture MoE routing: "
                                f"{rec.get('error')}")
        if rec.get("new"):
            await client.reset_prefix_cache()  # blocks cached before capture have no routing
        return Routing(layers=rec["layers"], top_k=rec["top_k"], dtype=rec["dtype"])
