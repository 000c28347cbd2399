"""``agentrl serve-tinker``: build the trainer, the service and the app, and serve them until Ctrl-C or
SIGTERM. The sampling engine starts on the first sampling request and stops with the server."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from agentrl.config.tinker import TinkerConfig
from agentrl.core.errors import ConfigError

log = logging.getLogger(__name__)
DEFAULT_CONTEXT = 4096


class TinkerExtraMissing(ConfigError, ImportError):
    """The tinker SDK, whose wire types the server speaks, is not installed."""

    code = "config.tinker_missing"


def context_of(cfg: TinkerConfig) -> int:
    """The window served: ``max_model_len``, else the model's ``max_position_embeddings`` (at most 4096)."""
    from agentrl.core.shape import read_window

    if cfg.max_model_len is not None:
        return cfg.max_model_len
    positions = read_window(cfg.model)
    return min(positions, DEFAULT_CONTEXT) if positions else 2048


def build(cfg: TinkerConfig) -> Any:
    """The app for ``cfg`` (the trainer's model loaded); raises a config error for keys or a model that
    cannot be used."""
    try:
        import tinker  # noqa: F401  (the SDK's request and protobuf types)
    except ImportError as e:
        raise TinkerExtraMissing("agentrl serve-tinker needs the tinker SDK: pip install 'agentrl[tinker]'") from e
    from agentrl.inference.server import validate_model_dir
    from agentrl.tinker.app import build_app
    from agentrl.tinker.checkpoints import Checkpoints
    from agentrl.tinker.keys import Keys, check_open, load_keys
    from agentrl.tinker.sampler import SlotSampler
    from agentrl.tinker.sampling import Sampling
    from agentrl.tinker.service import TinkerService
    from agentrl.tinker.trainer import LoraTrainer

    keys = load_keys(Path(cfg.api_keys) if cfg.api_keys else None)
    check_open(keys, cfg.host)
    validate_model_dir(cfg.model)
    state = Path(cfg.dir)
    state.mkdir(parents=True, exist_ok=True)
    window = context_of(cfg)
    trainer = LoraTrainer(Path(cfg.model), max_rank=cfg.max_rank)
    svc = TinkerService(trainer, Checkpoints(state / "checkpoints"), model_name=cfg.served_name,
                        model_dir=Path(cfg.model).resolve(), max_context=window, gap_timeout_s=cfg.seq_gap_timeout_s)

    async def start_engine() -> SlotSampler:
        return await SlotSampler.start(Path(cfg.model), state_dir=state, max_adapters=cfg.max_adapters,
                                       max_rank=cfg.max_rank, max_model_len=window, log_dir=state / "logs")

    return build_app(svc, Sampling(svc, start_engine), Keys(keys), session_ttl_s=cfg.session_ttl_s)


def serve(cfg: TinkerConfig) -> None:
    """Serve ``cfg`` in this process until interrupted."""
    import uvicorn

    from agentrl.http.serve import bind_socket, url_of

    app = build(cfg)
    sock = bind_socket(cfg.host, cfg.port)
    print(f"agentrl serve-tinker: {cfg.served_name} at {url_of(sock)} (TINKER_BASE_URL); state in {cfg.dir}",
          flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=75,
                                           timeout_graceful_shutdown=5, server_header=False))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
