"""A vLLM logits processor that makes every engine step last at least ``STEP_DELAY_S`` while a flag file exists.

Tests that must catch a generation mid-way (pause the engine after some but not all of its tokens) turn the
flag on for that moment only (``vllm_metrics.slowed_engine``). A step of the tiny model takes well under a
millisecond; one pause round trip through the API server can take far longer on a loaded machine, so an
unslowed engine can finish a whole generation before the pause lands. Slowed, a 100-token generation lasts
at least 2 s. The processor changes no logits; it only sleeps, in ``update_state``, which the model runner
calls before every forward pass whatever the sampling settings.

Engines started by the tests load it with ``vllm_metrics.STEP_DELAY_ARGS`` (the server runs from the
repository root) and find the flag's path in ``$AGENTRL_TEST_STEP_DELAY_FLAG``.
"""

from __future__ import annotations

import os
import time

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from tests.integration.vllm_metrics import STEP_DELAY_FLAG_ENV, STEP_DELAY_S


class StepDelay(LogitsProcessor):
    def __init__(self, vllm_config: object, device: torch.device, is_pin_memory: bool) -> None:
        self.flag = os.environ.get(STEP_DELAY_FLAG_ENV)

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self.flag and os.path.exists(self.flag):
            time.sleep(STEP_DELAY_S)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
