"""What each use of vLLM's private API records about itself, as data: the vLLM version it was written for
and every target it touches (:class:`Target`). :mod:`agentrl.engine.vllm_patches` attaches one
:class:`PrivateUse` to each of its patches, per-instance wraps and lookups; the contract test
(``tests/unit/engine/test_vllm_contract.py``) imports every target from the installed vLLM.

This module imports nothing outside the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

Kind = Literal["patch", "wrap", "lookup"]
"""``patch``: a class attribute of vLLM replaced in the worker process; ``wrap``: an attribute of one vLLM
object replaced (per instance); ``lookup``: private state read, nothing replaced."""


class Target(NamedTuple):
    """One thing of vLLM's that agentrl touches: the dotted ``attr`` of module ``module``.

    ``instance``: the last name of ``attr`` is an attribute the instances of the class before it carry (set in
    one of its methods, or a dataclass field), not one of the class itself: ``("vllm.v1.worker.gpu_model_runner",
    "GPUModelRunner.positions", True)``. ``optional``: the code copes when ``module`` does not import (a GPU
    build without vLLM's CPU runner)."""

    module: str
    attr: str
    instance: bool = False
    optional: bool = False

    def __str__(self) -> str:
        return f"{self.module}:{self.attr}" + (" (instance attribute)" if self.instance else "")


@dataclass(frozen=True)
class PrivateUse:
    """One patch, per-instance wrap or private lookup: the function that does it (``name``), its ``kind``, the
    vLLM version it was written for and checked against, and the ``targets`` it touches."""

    name: str
    kind: Kind
    written_for: str
    targets: tuple[Target, ...]
