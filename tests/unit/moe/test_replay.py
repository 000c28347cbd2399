"""MoE routing replay on tiny random models of each supported family (CPU, no downloads): the replayed
forward runs exactly the recorded experts, with differentiable gate weights, also under gradient
checkpointing, peft LoRA and FSDP2."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from agentrl.moe import MoEInfo, RoutingReplay, UnsupportedMoE, find_routers, moe_info

B, T = 2, 6
_COMMON: dict[str, Any] = dict(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, max_position_embeddings=64, num_experts_per_tok=2, bos_token_id=1, eos_token_id=2,
    pad_token_id=0,
)
FAMILIES: dict[str, dict[str, Any]] = {
    # three layers, the middle one dense: dense rows of the routing are ignored
    "qwen3_moe": dict(num_hidden_layers=3, mlp_only_layers=[1], num_experts=8, moe_intermediate_size=16,
                      norm_topk_prob=True),
    "qwen2_moe": dict(num_hidden_layers=2, num_experts=6, moe_intermediate_size=16,
                      shared_expert_intermediate_size=24, norm_topk_prob=False),
    "mixtral": dict(num_hidden_layers=2, num_local_experts=4),
    "olmoe": dict(num_hidden_layers=2, num_experts=8, norm_topk_prob=False),
}


def make_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, MoEInfo]:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, **_COMMON, **FAMILIES[family])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config.use_cache = False
    model.train()
    info = moe_info(config)
    assert info is not None
    return model, info


def input_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 64, (B, T), generator=torch.Generator().manual_seed(seed))


class Recorder:
    """Hooks that record, per MoE layer, the router's own top-k (hooked before replay is installed, so it
    sees the unforced ids) and what each experts module ran: its input, ids, weights and output."""

    def __init__(self, model: nn.Module) -> None:
        self.own: dict[int, torch.Tensor] = {}
        self.ran: dict[int, tuple[torch.Tensor, ...]] = {}
        self.experts: dict[int, nn.Module] = {}
        for layer, router in find_routers(model).items():
            router.register_forward_hook(self._own(layer))
        for name, module in model.named_modules():
            if name.endswith("mlp.experts"):
                layer = int(name.split("layers.")[1].split(".")[0])
                self.experts[layer] = module
                module.register_forward_hook(self._ran(layer))

    def _own(self, layer: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self.own[layer] = output[2].detach().reshape(B, T, -1)
        return hook

    def _ran(self, layer: int) -> Any:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            hidden, ids, weights = args
            self.ran[layer] = (hidden.detach(), ids.detach().reshape(B, T, -1), weights.detach(), output.detach())
        return hook

    def routing(self, info: MoEInfo) -> torch.Tensor:
        """The recorded own top-k as a replay routing (dense layers' rows filled with junk)."""
        out = torch.full((B, T, info.layers, info.top_k), 999, dtype=torch.long)
        for layer in info.moe_layers:
            out[:, :, layer] = self.own[layer]
        return out


def random_routing(info: MoEInfo, seed: int = 7) -> torch.Tensor:
    """Distinct random expert ids per (token, layer)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(B, T, info.layers, info.experts, generator=g)
    return scores.topk(info.top_k, dim=-1).indices


def router_weights(model: nn.Module) -> dict[int, torch.Tensor]:
    return {layer: router.weight for layer, router in find_routers(model).items()}


def hand_experts(experts: nn.Module, router_weight: torch.Tensor, hidden: torch.Tensor, ids: torch.Tensor,
                 norm: bool) -> torch.Tensor:
    """The routed experts' output computed by hand for the given expert ids: softmax gate weights of the
    router at those ids (renormalised if ``norm``), SwiGLU experts."""
    probs = torch.softmax(hidden.double() @ router_weight.double().T, dim=-1)
    weights = probs.gather(-1, ids)
    if norm:
        weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(hidden, dtype=torch.float64)
    inter = experts.gate_up_proj.shape[1] // 2
    for t in range(hidden.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate_up = experts.gate_up_proj[e].double() @ hidden[t].double()
            act = experts.act_fn(gate_up[:inter]) * gate_up[inter:]
            out[t] += weights[t, k] * (experts.down_proj[e].double() @ act)
    return out.to(hidden.dtype)


def lm_loss(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(input_ids=ids).logits
    return logits, F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@pytest.fixture(params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_own_routing_replays_the_plain_forward(family: str, dtype: torch.dtype) -> None:
    model, info = make_model(family, dtype=dtype)
    rec = Recorder(model)
    ids = input_ids()
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    routing = rec.routing(info)
    replay = RoutingReplay(model, info)
    replay.set(routing)
    with torch.no_grad():
        replayed = model(input_ids=ids).logits
    torch.testing.assert_close(replayed, plain, rtol=0, atol=0)  # same ids, same gate weights, bit for bit
    for layer in info.moe_layers:
        assert torch.equal(rec.ran[layer][1], routing[:, :, layer])
    assert replay.stats() == {"routing_decisions": B * T * len(info.moe_layers), "routing_mismatch_frac": 0.0,
                              "routing_replayed_frac": 1.0, "routing_known_frac": 1.0}


def test_forced_routing_runs_the_recorded_experts(family: str) -> None:
    model, info = make_model(family)
    rec = Recorder(model)
    ids = input_ids()
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    routing = random_routing(info)
    replay = RoutingReplay(model, info)
    replay.set(routing)
    logits, loss = lm_loss(model, ids)
    loss.backward()
    replay.clear()
    assert not torch.allclose(logits, plain, atol=1e-4)
    weights = router_weights(model)
    for layer in info.moe_layers:
        hidden, ran, _, out = rec.ran[layer]
        assert torch.equal(ran, routing[:, :, layer])
        want = hand_experts(rec.experts[layer], weights[layer].detach(), hidden, ran.reshape(B * T, -1),
                            info.norm_topk_prob)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
        assert weights[layer].grad is not None and weights[layer].grad.abs().sum() > 0
    stats = replay.stats()
    assert stats["routing_decisions"] == B * T * len(info.moe_layers)
    assert stats["routing_mismatch_frac"] > 0
    assert stats["routing_replayed_frac"] == 1.0


def test_unknown_tokens_use_their_own_routing(family: str) -> None:
    model, info = make_model(family)
    rec = Recorder(model)
    ids = input_ids()
    routing = random_routing(info)
    routing[:, -1] = -1  # last token of each sequence: all layers unknown
    first_moe = info.moe_layers[0]
    routing[0, 2, first_moe] = -1  # one (token, layer) unknown
    replay = RoutingReplay(model, info)
    replay.set(routing)
    with torch.no_grad():
        model(input_ids=ids)
    for layer in info.moe_layers:
        ran = rec.ran[layer][1]
        unknown = routing[:, :, layer, 0] == -1
        assert torch.equal(ran[~unknown], routing[:, :, layer][~unknown])
        assert torch.equal(ran[unknown], rec.own[layer][unknown])
    known = B * (T - 1) * len(info.moe_layers) - 1
    stats = replay.stats()
    assert stats["routing_decisions"] == known
    assert stats["routing_replayed_frac"] == 1.0
    assert stats["routing_known_frac"] == pytest.approx(known / (B * T * len(info.moe_layers)))


def test_unknown_everywhere_is_the_plain_forward(family: str) -> None:
    model, info = make_model(family)
    ids = input_ids()
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    replay = RoutingReplay(model, info)
    replay.set(torch.full((B, T, info.layers, info.top_k), -1))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, plain, rtol=1e-6, atol=1e-6)
    assert replay.stats()["routing_decisions"] == 0


def _replayed_grads(model: nn.Module, info: MoEInfo, ids: torch.Tensor, routing: torch.Tensor,
                    clear_before_backward: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    replay = RoutingReplay(model, info)
    replay.set(routing)
    _, loss = lm_loss(model, ids)
    if clear_before_backward:
        replay.clear()
    loss.backward()
    replay.remove()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, replay.stats()


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_recompute_replays_the_same_ids(family: str, reentrant: bool) -> None:
    ids = input_ids()
    plain_model, info = make_model(family)
    routing = random_routing(info)
    want, want_stats = _replayed_grads(plain_model, info, ids, routing)
    ckpt_model, _ = make_model(family)
    ckpt_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    got, got_stats = _replayed_grads(ckpt_model, info, ids, routing)
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
    assert got_stats == want_stats  # recompute during backward is not counted twice
    if reentrant:
        return

    # control: clearing before backward makes the recompute route by itself, which changes the grads
    # (or non-reentrant checkpointing notices that the recompute saved other tensors)
    other, _ = make_model(family)
    other.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        wrong, _ = _replayed_grads(other, info, ids, routing, clear_before_backward=True)
    except torch.utils.checkpoint.CheckpointError:
        return
    assert any(not torch.allclose(wrong[n], want[n], atol=1e-6) for n in want)


def test_peft_lora_model(family: str) -> None:
    from peft import LoraConfig, get_peft_model

    base, info = make_model(family)
    ids, routing = input_ids(), random_routing(info)
    base_replay = RoutingReplay(base, info)
    base_replay.set(routing)
    with torch.no_grad():
        want = base(input_ids=ids).logits
    base_replay.remove()

    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    rec = Recorder(model)
    replay = RoutingReplay(model, info)
    replay.set(routing)
    logits, loss = lm_loss(model, ids)
    loss.backward()
    torch.testing.assert_close(logits, want, rtol=1e-6, atol=1e-6)  # LoRA B starts at zero
    for layer in info.moe_layers:
        assert torch.equal(rec.ran[layer][1], routing[:, :, layer])
    lora_grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_grads and all(g is not None for g in lora_grads)


def test_peft_lora_on_expert_parameters(family: str) -> None:
    """peft's ``target_parameters`` puts LoRA on the 3D expert weights (``gate_up_proj``/``down_proj``)."""
    from peft import LoraConfig, get_peft_model

    base, info = make_model(family)
    ids, routing = input_ids(), random_routing(info)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"],
                                            target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]))
    with torch.no_grad():  # make the expert LoRA non-trivial
        for name, param in model.named_parameters():
            if "lora_B" in name and "experts" in name:
                param.normal_(std=0.1)
    rec = Recorder(model)
    replay = RoutingReplay(model, info)
    replay.set(routing)
    _, loss = lm_loss(model, ids)
    loss.backward()
    for layer in info.moe_layers:
        assert torch.equal(rec.ran[layer][1], routing[:, :, layer])
    expert_grads = [p.grad for n, p in model.named_parameters() if "lora_A" in n and "experts" in n]
    assert expert_grads and all(g is not None and g.abs().sum() > 0 for g in expert_grads)


def test_disabled_replay_routes_normally_but_counts_mismatches(family: str) -> None:
    model, info = make_model(family)
    ids = input_ids()
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    replay = RoutingReplay(model, info, enabled=False)
    replay.set(random_routing(info))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, plain, rtol=0, atol=0)
    stats = replay.stats()
    assert stats["routing_decisions"] == B * T * len(info.moe_layers)
    assert stats["routing_mismatch_frac"] > 0
    assert stats["routing_replayed_frac"] == 0.0
    replay.reset_stats()
    assert replay.stats() == {"routing_decisions": 0, "routing_mismatch_frac": 0.0, "routing_replayed_frac": 0.0,
                              "routing_known_frac": 0.0}


def test_routing_is_validated() -> None:
    model, info = make_model("qwen3_moe")
    replay = RoutingReplay(model, info)
    good = random_routing(info)
    with pytest.raises(ValueError, match="shape"):
        replay.set(good[:, :, :2])
    with pytest.raises(TypeError, match="integer"):
        replay.set(good.float())
    bad = good.clone()
    bad[0, 0, 0, 0] = info.experts
    with pytest.raises(ValueError, match="outside"):
        replay.set(bad)
    bad = good.clone()
    bad[0, 0, 0, 0] = -1
    with pytest.raises(ValueError, match="mixing"):
        replay.set(bad)
    bad = good.clone()
    bad[0, 0, 0, 1] = bad[0, 0, 0, 0]
    with pytest.raises(ValueError, match="twice"):
        replay.set(bad)
    bad = good.clone()
    bad[:, :, 1] = 12345  # the dense layer's rows are ignored
    replay.set(bad)
    with pytest.raises(RuntimeError, match="set the routing of this batch"):
        model(input_ids=input_ids()[:, :4])
    replay.clear()
    model(input_ids=input_ids()[:, :4])


def test_router_count_must_match_the_config() -> None:
    model, info = make_model("qwen3_moe")
    with pytest.raises(RuntimeError, match="MoE routers"):
        RoutingReplay(model, MoEInfo("qwen3_moe", info.experts, info.top_k, 3, (0, 1, 2), True))
    with pytest.raises(RuntimeError, match="norm_topk_prob"):
        RoutingReplay(model, MoEInfo("qwen3_moe", info.experts, info.top_k, 3, (0, 2), False))


def test_moe_info_of_supported_families() -> None:
    from transformers import AutoConfig

    qwen3 = AutoConfig.for_model("qwen3_moe", num_hidden_layers=6, num_experts=16, num_experts_per_tok=4,
                                 decoder_sparse_step=2, mlp_only_layers=[3])
    info = moe_info(qwen3)
    assert info == MoEInfo("qwen3_moe", 16, 4, 6, (1, 5), False)
    assert info.as_doctor() == {"experts": 16, "top_k": 4}
    # a config.json dict gets the family's defaults (decoder_sparse_step 1, no mlp_only_layers)
    assert moe_info({"model_type": "qwen3_moe", "num_hidden_layers": 2, "num_experts": 8,
                     "num_experts_per_tok": 2, "norm_topk_prob": True}) == \
        MoEInfo("qwen3_moe", 8, 2, 2, (0, 1), True)
    assert moe_info({"model_type": "mixtral", "num_hidden_layers": 3, "num_local_experts": 8,
                     "num_experts_per_tok": 2}) == MoEInfo("mixtral", 8, 2, 3, (0, 1, 2), True)
    assert moe_info(AutoConfig.for_model("olmoe", num_hidden_layers=2)) == MoEInfo("olmoe", 64, 8, 2, (0, 1), False)
    assert moe_info(AutoConfig.for_model("qwen2_moe", num_hidden_layers=2, num_experts=60, num_experts_per_tok=4)) \
        == MoEInfo("qwen2_moe", 60, 4, 2, (0, 1), False)
    for family in FAMILIES:
        assert moe_info(AutoConfig.for_model(family, **_COMMON, **FAMILIES[family])).family == family


def test_moe_info_of_dense_and_unsupported_models() -> None:
    from transformers import AutoConfig

    assert moe_info(AutoConfig.for_model("qwen2", num_hidden_layers=2)) is None
    assert moe_info({"model_type": "llama", "num_hidden_layers": 2}) is None
    assert moe_info({"model_type": "qwen3_moe", "num_hidden_layers": 2, "num_experts": 0}) is None
    for family in ("deepseek_v3", "deepseek_v2", "glm4_moe", "llama4", "llama4_text", "dbrx"):
        with pytest.raises(UnsupportedMoE, match=f"{family}.*qwen3_moe, qwen2_moe, mixtral, olmoe"):
            moe_info(AutoConfig.for_model(family))
    for config in ({"model_type": "dbrx", "ffn_config": {"moe_num_experts": 16, "moe_top_k": 4}},
                   {"model_type": "my_moe", "n_routed_experts": 64},
                   {"model_type": "my_vl", "text_config": {"model_type": "my_text", "num_local_experts": 8}},
                   {"model_type": "my_dbrx", "ffn_config": {"moe_num_experts": 16}}):
        with pytest.raises(UnsupportedMoE, match=config["model_type"]):
            moe_info(config)


@pytest.fixture
def gloo_world(tmp_path: Path) -> Iterator[None]:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_replay_after_fully_shard(gloo_world: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, info = make_model("qwen3_moe")
    ids, routing = input_ids(), random_routing(info)
    want, _ = _replayed_grads(copy.deepcopy(model), info, ids, routing)
    want_logits = _replayed_logits(copy.deepcopy(model), info, ids, routing)

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh("cpu", (1,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    rec = Recorder(model)
    torch.testing.assert_close(_replayed_logits(model, info, ids, routing), want_logits, rtol=1e-6, atol=1e-6)
    for layer in info.moe_layers:
        assert torch.equal(rec.ran[layer][1], routing[:, :, layer])
    model.zero_grad()
    got, _ = _replayed_grads(model, info, ids, routing)
    for name, grad in got.items():
        full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        torch.testing.assert_close(full, want[name], rtol=1e-5, atol=1e-6, msg=name)


def _replayed_logits(model: nn.Module, info: MoEInfo, ids: torch.Tensor, routing: torch.Tensor) -> torch.Tensor:
    replay = RoutingReplay(model, info)
    replay.set(routing)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    replay.remove()
    return logits


@pytest.mark.parametrize("setting, why", [({"tie_word_embeddings": True}, "tied embeddings"),
                                          ({"norm_topk_prob": True}, "norm_topk_prob")])
def test_olmoe_settings_vllm_serves_differently_are_refused(setting: dict[str, Any], why: str) -> None:
    from transformers import AutoConfig

    with pytest.raises(UnsupportedMoE, match=why):
        moe_info(AutoConfig.for_model("olmoe", num_hidden_layers=2, **setting))
