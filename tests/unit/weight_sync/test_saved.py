"""What a saved adapter carries decides how it is served again (agentrl.launch.described.served_as_trained):
tensors trained whole (merged), an output-layer LoRA (the engines wrap ``lm_head``; from the slots)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentrl.config.run import RunConfig  # noqa: E402
from agentrl.config.sync import MergedSync, ShmSync  # noqa: E402
from agentrl.launch.described import served_as_trained  # noqa: E402
from agentrl.tools.bench.models import save_lora  # noqa: E402
from agentrl.weight_sync.saved import carries_output_lora, carries_whole_tensors  # noqa: E402

LINEAR = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 8),
          "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(8, 4)}
HEAD = {"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 8),
        "base_model.model.lm_head.lora_B.weight": torch.zeros(20, 4)}
EMBEDDING = {"base_model.model.model.embed_tokens.weight": torch.zeros(20, 8)}


@pytest.mark.parametrize(("tensors", "whole", "head"), [(LINEAR, False, False), ({**LINEAR, **HEAD}, False, True),
                                                        ({**LINEAR, **EMBEDDING}, True, False)],
                         ids=["linear", "output layer", "embedding"])
def test_a_saved_adapter_is_served_as_it_was_trained(tmp_path: Path, tensors: dict, whole: bool, head: bool) -> None:
    adapter = save_lora(tmp_path / "a", tensors, rank=4)
    assert carries_whole_tensors(adapter) is whole and carries_output_lora(adapter) is head
    cfg = RunConfig(env="calc", model="m").resolved()  # calc's preset trains the embedding whole: merged
    served = cfg.with_changes(served_as_trained(cfg, adapter)).resolved()
    assert served.transport == (MergedSync() if whole else ShmSync())
    assert ("lm_head" in served.inference.lora_target_modules) is head
