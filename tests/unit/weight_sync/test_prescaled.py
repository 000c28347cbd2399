"""B pre-scaled by the publisher: the packed buffer holds ``scale * B`` and plain A, and says so to the engines."""

from __future__ import annotations

import json

import torch

from agentrl.weight_sync.inplace import fill, layout_meta, layout_views, pack_layout


def test_fill_scales_b_only_and_meta_names_the_scale() -> None:
    tensors = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(4, 8),
               "base_model.model.layers.0.q_proj.lora_B.weight": torch.randn(8, 4)}
    layout, nbytes = pack_layout(tensors)
    views = layout_views(torch.zeros(nbytes, dtype=torch.uint8), layout)
    fill(views, layout, tensors, 2.0)
    got = {n: v for v, (n, *_) in zip(views, layout, strict=True)}
    a, b = (n for n in sorted(tensors))
    assert torch.equal(got[a], tensors[a]) and torch.equal(got[b], 2.0 * tensors[b])
    assert json.loads(layout_meta(layout, nbytes, 2.0))["b_scaled"] == 2.0
    fill(views, layout, tensors, None)
    assert torch.equal(got[b], tensors[b]) and "b_scaled" not in json.loads(layout_meta(layout, nbytes, None))
