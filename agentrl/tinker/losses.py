"""The losses by name, as Tinker's documentation defines them: each a sum over a datum's tokens (no
normalisation: the caller weighs tokens through ``weights`` or ``advantages``), of the learner's logprobs
``lp`` of ``target_tokens``:

- ``cross_entropy``: ``-sum(lp * weights)``;
- ``importance_sampling``: ``-sum(exp(lp - q) * advantages)``, ``q`` the sampler's ``logprobs``;
- ``ppo``: ``-sum(min(r * A, clip(r, low, high) * A))`` with ``r = exp(lp - q)``;
- ``cispo``: ``-sum(sg(clip(r, low, high)) * lp * A)``;
- ``dro``: ``-sum(lp * A - beta / 2 * (lp - q)^2)``.

``loss_fn_config`` sets ``clip_low_threshold`` and ``clip_high_threshold`` (ratio bounds, default 0.8 and
1.2) for ``ppo`` and ``cispo``, and ``beta`` (default 0.05) for ``dro``. ``forward_backward_custom`` needs
nothing here: the SDK runs it as a forward pass and a ``cross_entropy`` pass whose weights are the custom
loss's gradient."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from agentrl.tinker.errors import TinkerUserError

CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
DRO_DEFAULTS = {"beta": 0.05}
NEEDS = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
}
"""The ``loss_fn_inputs`` each loss needs beside ``target_tokens``."""
CONFIG = {"cross_entropy": {}, "importance_sampling": {}, "ppo": CLIP_DEFAULTS, "cispo": CLIP_DEFAULTS,
          "dro": DRO_DEFAULTS}
"""The ``loss_fn_config`` keys each loss takes, with their defaults."""


def _ratio(lp: Tensor, x: dict[str, Tensor]) -> Tensor:
    return torch.exp(lp - x["logprobs"])


def _cross_entropy(lp: Tensor, x: dict[str, Tensor], c: dict[str, float]) -> Tensor:
    return -(lp * x["weights"]).sum()


def _importance_sampling(lp: Tensor, x: dict[str, Tensor], c: dict[str, float]) -> Tensor:
    return -(_ratio(lp, x) * x["advantages"]).sum()


def _ppo(lp: Tensor, x: dict[str, Tensor], c: dict[str, float]) -> Tensor:
    r, adv = _ratio(lp, x), x["advantages"]
    clipped = torch.clamp(r, c["clip_low_threshold"], c["clip_high_threshold"])
    return -torch.minimum(r * adv, clipped * adv).sum()


def _cispo(lp: Tensor, x: dict[str, Tensor], c: dict[str, float]) -> Tensor:
    clipped = torch.clamp(_ratio(lp, x), c["clip_low_threshold"], c["clip_high_threshold"]).detach()
    return -(clipped * lp * x["advantages"]).sum()


def _dro(lp: Tensor, x: dict[str, Tensor], c: dict[str, float]) -> Tensor:
    return -(lp * x["advantages"] - 0.5 * c["beta"] * (lp - x["logprobs"]) ** 2).sum()


LOSSES: dict[str, Callable[[Tensor, dict[str, Tensor], dict[str, float]], Tensor]] = {
    "cross_entropy": _cross_entropy,
    "importance_sampling": _importance_sampling,
    "ppo": _ppo,
    "cispo": _cispo,
    "dro": _dro,
}


def resolve_config(name: str, config: dict[str, float | str] | None) -> dict[str, float]:
    """``config`` over the loss's defaults; an unknown loss or key is a :class:`TinkerUserError`."""
    if name not in LOSSES:
        hint = " (forward_backward_custom runs client-side: the SDK sends it as cross_entropy)" if name == "custom" \
            else ""
        raise TinkerUserError(f"loss_fn {name!r} is not served{hint}; the losses served are "
                              f"{', '.join(sorted(LOSSES))}")
    out = dict(CONFIG[name])
    for key, value in (config or {}).items():
        if key not in out:
            raise TinkerUserError(f"loss_fn_config[{key!r}]: {name} takes "
                                  f"{', '.join(sorted(out)) or 'no config'}")
        if isinstance(value, str):
            raise TinkerUserError(f"loss_fn_config[{key!r}]: a number, not {value!r}")
        out[key] = float(value)
    return out


def check_inputs(name: str, i: int, n: int, inputs: dict[str, Tensor]) -> None:
    """Datum ``i`` (``n`` input tokens) carries what loss ``name`` needs, each of ``n`` values."""
    for key in ("target_tokens", *NEEDS[name]):
        if key not in inputs:
            raise TinkerUserError(f"datum {i}: {name} needs loss_fn_inputs[{key!r}]")
        if inputs[key].shape != (n,):
            raise TinkerUserError(f"datum {i}: loss_fn_inputs[{key!r}] has shape {list(inputs[key].shape)}, "
                                  f"the model input {n} tokens")


def datum_loss(name: str, lp: Tensor, inputs: dict[str, Tensor], config: dict[str, float]) -> Tensor:
    """The loss of one datum whose target logprobs are ``lp``."""
    return LOSSES[name](lp, inputs, config)
