"""The learning-rate schedule: a pure function of the optimizer step, so a resumed run needs no scheduler
state (the checkpoint's optimizer step is enough)."""

from __future__ import annotations

import math

from agentrl.config.trainer import TrainerConfig


def lr_at(step: int, cfg: TrainerConfig) -> float:
    """The learning rate of optimizer step ``step`` (0-based): a linear warm-up over ``lr_warmup_steps``
    from ``lr / lr_warmup_steps``, then ``lr`` (``constant``) or a decay to ``lr * lr_min_ratio`` at
    ``lr_decay_steps`` (``cosine`` or ``linear``), held there after."""
    if step < cfg.lr_warmup_steps:
        return cfg.lr * (step + 1) / cfg.lr_warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    span = max(cfg.lr_decay_steps - cfg.lr_warmup_steps, 1)
    progress = min(max(step - cfg.lr_warmup_steps, 0) / span, 1.0)
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.lr_schedule == "cosine" else 1.0 - progress
    return cfg.lr * (cfg.lr_min_ratio + (1.0 - cfg.lr_min_ratio) * shape)
