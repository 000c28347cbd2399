"""Serving the policy endpoint: inside a training run (in its event loop, beside its engines' client) or on
its own (``agentrl serve-policy``: starting a vLLM server for ``--model`` or using ``--endpoint`` servers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agentrl.config.policy import DEFAULT_CONTEXT_TOKENS, PolicyConfig
from agentrl.config.window import WindowTooLong, check_window, given_windows, model_window, window_tables
from agentrl.core.errors import AgentRLError
from agentrl.http.auth import generate_token
from agentrl.http.policy.service import PolicyService
from agentrl.http.serve import bind_socket, bind_unix_socket, url_of

log = logging.getLogger("agentrl.http.policy")

__all__ = ["EndpointStartError", "WindowTooLong", "serve_policy", "serving", "window_settings"]

TOKEN_ENV = "AGENTRL_POLICY_TOKEN"
"""Environment variable holding the policy endpoint's token (when ``--token`` is not given)."""


class EndpointStartError(AgentRLError, RuntimeError):
    """The policy endpoint's server stopped before it started serving."""

    code = "policy.endpoint_start"


def window_settings(given: int | None, model: str, described: dict[str, Any] | None = None) -> dict[str, Any]:
    """The window of the engines ``agentrl serve-policy`` serves, as config tables: ``given``
    (``--max-context-tokens``); else none when a saved policy ``described`` its own (its layer holds it); else
    the model directory's ``max_position_embeddings``; else ``DEFAULT_CONTEXT_TOKENS`` (never an environment
    preset's, even for the embedded tiny model). Raises `WindowTooLong` when ``given`` exceeds the model's
    window (the rule of :mod:`agentrl.config.window`, which ``train`` and ``eval`` share)."""
    setting = "sampling.max_context_tokens"
    asked = {setting: given} if given is not None else {}
    check_window(model, asked, names={setting: "--max-context-tokens"})
    if given is None and given_windows(described):
        return {}
    return model_window(model, asked) or window_tables(DEFAULT_CONTEXT_TOKENS)


@contextlib.asynccontextmanager
async def serving(service: PolicyService, token: str, uds: str | None = None) -> AsyncIterator[str]:
    """Serve ``service`` on its configured host and port in this event loop until the block ends; yields the
    base URL. ``uds``: also serve on a Unix socket at that path (agent containers reach the endpoint through
    it). Signals stay with the caller."""
    import uvicorn

    from agentrl.http.policy.app import create_app

    cfg = service.config
    sock = bind_socket(cfg.host, cfg.port)
    socks = [sock]
    url = url_of(sock)
    try:
        if uds:
            socks.append(bind_unix_socket(uds))
        app = create_app(service, token, public_url=url)
    except BaseException:
        for s in socks:
            s.close()
        raise
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30,
                                           timeout_graceful_shutdown=5, server_header=False))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=socks), name="policy-endpoint")
    try:
        while not server.started:
            if task.done():
                task.result()
                raise EndpointStartError("the policy endpoint stopped while starting")
            await asyncio.sleep(0.02)
        yield url
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)
        for s in socks:
            s.close()
        if uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(uds)


async def serve_policy(config: PolicyConfig, *, model: str, endpoints: list[str], tool_parser: str,
                       log_dir: Path, chat_template: str | None = None, adapter: Path | None = None,
                       described: dict[str, Any] | None = None) -> None:
    """``agentrl serve-policy``: the engines (started here for ``model`` unless ``endpoints``), then the
    endpoint, until Ctrl-C or SIGTERM. ``adapter``: a saved LoRA adapter, published into the engines as a run
    that trained it would (``agentrl.launch.described.publish_saved``) and served in place of ``model``;
    ``described``: the settings it was trained with (window, sampling, engine dtype), under the others."""

    from agentrl.config.run import load_config
    from agentrl.launch.described import publish_saved, served_as_trained
    from agentrl.launch.stack import inference_stack

    token = config.token or os.environ.get(TOKEN_ENV) or None
    generated = token is None
    token = token or generate_token()
    window = window_settings(config.max_context_tokens, model, described)
    cfg = load_config(None, {"model": model, "endpoints": endpoints or None, "tool_parser": tool_parser,
                             "chat_template": chat_template, "name": "serve-policy", **window}, beneath=described)
    if adapter is not None:
        cfg = cfg.with_changes(served_as_trained(cfg, adapter))
    cfg = cfg.resolved()
    config = config.model_copy(update={"max_context_tokens": cfg.context_tokens})  # the engines' window
    async with inference_stack(cfg, log_dir) as stack:
        if adapter is not None:
            await publish_saved(cfg, stack.client, adapter, log_dir / "adapters")
        service = PolicyService(config, stack.client, stack.chat,
                                model=cfg.policy_model if adapter is not None else cfg.inference.served_model_name)
        async with serving(service, token) as url:
            print(f"agentrl policy endpoint: {url}/v1 (engines {', '.join(stack.client.endpoints)})",
                  file=sys.stderr, flush=True)
            if generated:
                print(f"agentrl policy endpoint: token {token}  (set {TOKEN_ENV} or pass --token to choose one)",
                      file=sys.stderr, flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
