"""The inference side of a run: the model on disk, the vLLM server(s), the client and the chat format."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from agentrl.config.run import RunConfig
from agentrl.core.errors import ConfigError, EngineError
from agentrl.inference.client import InferenceClient
from agentrl.inference.server import VLLMServer, reap_stale, validate_model_dir
from agentrl.launch.placement import Plan, plan_run
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.toolcalls import DEFAULT_TOOL_PARSER

log = logging.getLogger(__name__)


class EndpointsUnhealthy(EngineError, RuntimeError):
    """An inference endpoint of the run is not reachable or not healthy when the stack comes up."""

    code = "inference.endpoints_unhealthy"


class MaskCaptureUnavailable(EngineError, RuntimeError):
    """Sampling truncates (top-k, top-p, min-p) but an engine cannot record the kept sets the trainer replays."""

    code = "inference.mask_capture"


class LogprobsModeMismatch(ConfigError, ValueError):
    """An endpoint reports logprobs of the raw distribution while rollouts sample at another temperature."""

    code = "config.logprobs_mode"


def ensure_model(model: str) -> str:
    """Install the pinned embedded model if ``model`` is one of its default directories (a no-op when it is
    in place, checked by digest); validate the directory."""
    from agentrl.launch.pinned import ensure_embedded

    ensure_embedded(model)
    validate_model_dir(model)
    return model


def load_chat_format(model: str, tool_parser: str = DEFAULT_TOOL_PARSER,
                     chat_template: str | None = None) -> ChatFormat:
    """The chat format of a model directory's tokenizer, parsing tool calls with ``tool_parser``, rendering
    with ``chat_template`` (a built-in name or a file; None: the model's own). Its tool parser is built here
    (vLLM's parsers imported: seconds of CPU), never inside a run's event loop at the first parse."""
    from transformers import AutoTokenizer

    chat = ChatFormat(AutoTokenizer.from_pretrained(model), tool_parser=tool_parser, model_dir=model,
                      chat_template=chat_template)
    chat.parser  # noqa: B018
    return chat


@dataclass
class InferenceStack:
    """A client over the run's engines, the chat format, and the servers this process owns."""

    client: InferenceClient
    chat: ChatFormat
    servers: list[VLLMServer]


def local_servers(cfg: RunConfig, plan: Plan, run_dir: Path) -> list[VLLMServer]:
    """The vLLM servers the plan places on this machine (not started), each with its devices."""
    out = []
    for p in plan.servers:
        update: dict[str, object] = {"port": p.port or 0}
        if p.gpu_memory_utilization is not None:
            update["gpu_memory_utilization"] = p.gpu_memory_utilization
        out.append(VLLMServer(cfg.server_config().model_copy(update=update), run_dir, env=p.env))
    return out


def endpoint_model(url: str, wanted: str, timeout_s: float) -> str:
    """The name to request the base model by from the server at ``url``: ``wanted`` where it serves that name
    (agentrl's own servers do), else the one model it lists (``vllm serve DIR`` names it ``DIR``); ``wanted``
    when it lists several or cannot be asked (the health check then reports it)."""
    import httpx

    try:
        listed = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=timeout_s).json().get("data", [])
                  if not m.get("parent")]  # LoRA adapters name their base as parent
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return wanted
    if wanted in listed or len(listed) != 1:
        return wanted
    log.info("%s serves its model as %r: requesting that name", url, listed[0])
    return listed[0]


@contextlib.asynccontextmanager
async def inference_stack(cfg: RunConfig, run_dir: Path, plan: Plan | None = None) -> AsyncIterator[InferenceStack]:
    """Start (or connect to) the engines for a run, placed by ``plan`` (default: :func:`plan_run`); stops
    every server it started on exit."""
    plan = plan_run(cfg) if plan is None else plan
    run_dir.mkdir(parents=True, exist_ok=True)
    ensure_model(cfg.model)
    reap_stale(run_dir)
    servers: list[VLLMServer] = []
    client: InferenceClient | None = None
    try:
        endpoints = list(cfg.endpoints)
        if not endpoints:
            servers = local_servers(cfg, plan, run_dir)
            # started one after another: concurrent starts would contend for the same CPU cores on load
            for server in servers:
                await asyncio.to_thread(server.start)
            endpoints = [server.url for server in servers]
        chat = await asyncio.to_thread(load_chat_format, cfg.model, cfg.tool_parser, cfg.chat_template)
        name = cfg.inference.served_model_name
        if cfg.endpoints:  # a server agentrl did not start may serve the model under its own name
            name = await asyncio.to_thread(endpoint_model, endpoints[0], name, cfg.engine_health.timeout_s)
        client = InferenceClient(endpoints, model=name, timeout_s=cfg.engine_health.request_timeout_s)
        health = await client.health()
        dead = [url for url, ok in health.items() if not ok]
        if dead:
            raise EndpointsUnhealthy(f"inference endpoint(s) not reachable or not healthy: {', '.join(dead)}")
        yield InferenceStack(client=client, chat=chat, servers=servers)
    finally:
        if client is not None:
            await client.aclose()
        for server in servers:
            await asyncio.to_thread(server.stop)


async def check_sampling_logprobs(stack: InferenceStack, cfg: RunConfig) -> None:
    """Refuse to train at a temperature other than 1 on an engine whose logprobs are not of the sampled
    distribution (vLLM's default ``--logprobs-mode raw_logprobs``): the trainer would compare the wrong
    distribution. Servers agentrl starts report the sampled distribution; ``--endpoint`` servers are probed."""
    if cfg.sampling.temperature == 1.0 and not cfg.sampling.truncates:
        return  # at temperature 1 (top_p 1, top_k 0, min_p 0) raw and processed logprobs are the same
    prompt = stack.chat.prompt_ids([{"role": "user", "content": "Hello"}], None)
    found = await stack.client.reports_sampling_logprobs(prompt, model=cfg.inference.served_model_name)
    raw = [url for url, ok in found.items() if not ok]
    if raw:
        raise LogprobsModeMismatch(
            f"inference endpoint(s) {', '.join(raw)} report logprobs at temperature 1, but rollouts sample "
            f"at temperature {cfg.sampling.temperature}: the importance weights would be wrong. Start vLLM "
            "with --logprobs-mode processed_logprobs (or train at temperature 1)")


async def enable_sampling_masks(stack: InferenceStack, cfg: RunConfig, vocab: int | None) -> None:
    """Where sampling truncates, turn on every engine's sampling-mask capture (:mod:`agentrl.engine.masks`) or
    stop the run: a truncated sample is never scored as an untruncated one. ``vocab``: the model's vocabulary
    size, where known (a ``top_k`` at or above it cuts nothing and is refused as a mistake)."""
    s = cfg.sampling
    if not s.truncates:
        return
    if vocab is not None and s.top_k >= vocab:
        raise MaskCaptureUnavailable(f"sampling.top_k = {s.top_k} is not below the model's vocabulary of {vocab} "
                                     "tokens: it keeps every token; set top_k = 0 to disable it")
    recs = await stack.client.enable_mask_capture()
    bad = {url: rec.get("error") for url, rec in recs.items() if not rec.get("ok")}
    if bad:
        raise MaskCaptureUnavailable(
            f"sampling truncates (top_p {s.top_p}, top_k {s.top_k}, min_p {s.min_p}) but engine(s) cannot record "
            f"the kept sets the trainer replays: {'; '.join(f'{u}: {e}' for u, e in bad.items())}")
    log.info("sampling-mask capture on (top_p %s, top_k %s, min_p %s): the trainer renormalises over each "
             "sampled token's kept set", s.top_p, s.top_k, s.min_p)
