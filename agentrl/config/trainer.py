"""Configuration of the FSDP2 trainer worker and its policy loss (pure pydantic: no torch import)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentrl.config.base import Section
from agentrl.config.errors import SettingError

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama-style decoder layer: attention's four projections and the MLP's three."""

OUTPUT_LAYER = "lm_head"
"""The output layer's module name (Llama, Qwen, Mistral...; peft's and vLLM's name for its LoRA)."""

LORA_LR_SCALE = 5.0
"""The LoRA learning rate as a multiple of the full-weight one, for an adapter on every linear layer with
``lora_alpha / lora_rank = 2`` (rank 16, alpha 32) and the same schedule. Measured on the embedded calc
model (full weights best at 4e-4, the adapter at 2e-3; docs/training.md); "LoRA Without Regret" (2025)
found about 10x on models of 1B parameters and more, with alpha 32 and the rank-independent ``alpha / r``
convention used here. Tensors trained whole beside the adapter (``lora_train_norms``, ``lora_train_embedding``)
get the full-weight rate back: ``lr / LORA_LR_SCALE``."""


class LossConfig(Section):
    """Hyper-parameters of :func:`policy_loss`."""

    clip_low: float = Field(0.2, ge=0.0, le=1.0)
    """Lower PPO clip: the ratio is clipped below at ``1 - clip_low``."""
    clip_high: float = Field(0.28, ge=0.0)
    """Upper PPO clip: the ratio is clipped above at ``1 + clip_high`` (asymmetric, "clip-higher")."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the KL penalty to the reference (base) policy, k3 estimator; 0 disables it."""
    aggregation: Literal["token_mean", "seq_mean"] = "token_mean"
    """``token_mean``: sum over masked tokens / number of masked tokens;
    ``seq_mean``: mean over sequences of each sequence's masked-token mean."""
    is_correction: Literal["none", "tis", "decoupled"] = "tis"
    """Off-policy correction for the gap between the behaviour (inference) and proximal policies."""
    tis_cap: float = Field(2.0, ge=1.0)
    """Cap of the behaviour importance weight: truncation for ``tis``, drop threshold for ``decoupled``."""
    ratio_level: Literal["token", "sequence"] = "token"
    """``token``: one PPO ratio per token (PPO / GRPO). ``sequence``: one ratio per sequence (GSPO), the
    geometric mean of its loss tokens' ratios, ``s = exp(mean(logp - old))``, clipped as a whole with the
    same ``clip_low`` / ``clip_high`` (the whole sequence is clipped or none of it) and with every token's
    gradient ``s * A * grad logp / |y|`` under ``seq_mean``. The GSPO paper clips far tighter (about
    3e-4 / 4e-4) than the token defaults, which are meant for token ratios: set both clips when choosing
    ``sequence``. The behaviour weight of ``is_correction`` stays per token, multiplying each token's term
    as with token ratios; ``is_correction = "none"`` takes the ratio against the behaviour logprobs, as in
    the paper. Steadier than token ratios where single-token likelihoods are noisy (MoE routing)."""
    adv_std_normalize: bool = True
    """Divide group-centred rewards by the group's standard deviation (GRPO); else only centre them."""
    negative_weight: float = Field(1.0, ge=0.0, le=1.0)
    """Multiplier of negative advantages (1: symmetric GRPO; 0: only episodes that beat their group's mean are
    trained, reinforced by their advantage). Below 1, successes are reinforced more than failures are
    penalised, which sharpens the policy towards its own successes at the cost of exploration. On the
    embedded ``calc`` job, 0.25 and 0 did not learn measurably faster than 1 (docs/training.md)."""


class DistributedConfig(Section):
    """Where the trainer's ranks run: one node (the default), or several nodes joined by torchrun's c10d
    rendezvous. The orchestrator starts one node itself; every other node runs ``agentrl trainer-node
    --join <run>/trainer_join.json`` (see docs/scale-out.md)."""

    nnodes: int = Field(1, ge=1)
    """Nodes in the trainer job (torchrun ``--nnodes``)."""
    master_addr: str = "127.0.0.1"
    """Rendezvous host: an address of the orchestrator's node that every node can reach."""
    master_port: int = Field(0, ge=0, le=65535)
    """Rendezvous port; 0 picks a free one (one node only: the other nodes must know it in advance)."""
    orchestrator_addr: str = "127.0.0.1"
    """Interface the orchestrator listens on for rank 0, which the rendezvous may place on any node: an
    address every node can reach when ``nnodes`` > 1. The connection is authenticated with a per-run key."""
    rdzv_timeout_s: float = Field(900.0, gt=0.0)
    """How long the nodes wait for each other at the rendezvous."""

    @model_validator(mode="after")
    def _check(self) -> DistributedConfig:
        if self.nnodes > 1 and self.master_port == 0:
            raise SettingError("trainer.distributed.master_port must be set when nnodes > 1: every node must "
                               "know the rendezvous port before it starts")
        return self


class TrainerSettings(Section):
    """Everything the trainer worker needs but the model it trains: a run's ``[trainer]`` section (the run
    has one model path, its ``model``; :meth:`agentrl.config.run.RunConfig.trainer_config` adds it)."""

    lora: bool = True
    """Train a LoRA adapter (True) or fine-tune every weight (False)."""
    frozen_parameters: list[str] = Field(default_factory=list)
    """Full-weight training only: parameters whose name contains one of these strings stay frozen (for example
    ``["embed_tokens", "norm"]``: the embedding, tied to the output layer on small models, and every norm).
    Every weight is still published to the engines. Empty: every weight trains."""
    lora_rank: int = Field(16, ge=1)
    """LoRA rank ``r``."""
    lora_alpha: float = Field(32.0, gt=0.0)
    """LoRA scaling numerator: the update is scaled by ``lora_alpha / lora_rank``."""
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA input (0 keeps the forward deterministic, which the off-policy ratios assume)."""
    lora_target_modules: list[str] = Field(default_factory=lambda: list(ALL_LINEAR))
    """Names of the linear modules that get LoRA adapters. The default is every linear layer of a decoder
    layer, attention and MLP (``ALL_LINEAR``, the Llama/Qwen/Mistral names): LoRA matches full fine-tuning in
    RL when it covers the MLP too ("LoRA Without Regret", 2025), and on the embedded calc model an adapter on
    attention alone learned a quarter as much as full weights (docs/training.md). Names a model does not
    have are ignored as long as one matches. On a mixture-of-experts model the MLP names are dropped and the
    adapter covers attention: they would name the experts' fused weights, which the adapter sync does not
    carry (``agentrl.trainer.model.lora_targets``)."""
    lora_train_norms: bool = False
    """LoRA only: train every norm of the model whole beside the adapter (peft's ``modules_to_save``: every
    module whose name ends in ``norm``, a few thousand weights on small models). A norm scales whole feature
    directions at once, which a low-rank update of the linear layers reaches only indirectly: on the embedded
    calc model, freezing the norms cost full-weight training more than the adapter's whole gap to it
    (docs/training.md). vLLM's LoRA slots hold no norms, so the engines serve the policy merged
    (``pipeline.weight_sync = "merged"``, which ``auto`` then chooses): the adapter and the norms cross, and
    each engine merges the one and loads the other. The norms train at the full-weight rate the adapter's
    is derived from (``lr / LORA_LR_SCALE``), on the same schedule."""
    lora_train_embedding: bool = False
    """LoRA only: train the input embedding whole beside the adapter, and with it the output layer where the
    model ties the two (small models do: the embedded one, SmolLM2, Qwen2.5 up to 3B). The output layer sets
    every logit, which a low-rank update of the decoder's linear layers reaches only through the last hidden
    state. The tensor crosses whole at every sync (vocab x hidden: 122K weights on the embedded model, 28M on
    SmolLM2-135M), so the engines serve the policy merged, as with ``lora_train_norms``, and it trains at the
    full-weight rate (``lr / LORA_LR_SCALE``), on the same schedule."""
    lora_train_unembed: bool = False
    """LoRA only: a LoRA adapter on the output layer too (``lm_head``; Tinker's ``train_unembed``), at the
    adapter's rate: a rank-``r`` update of every logit, which vLLM's LoRA slots serve (its output-layer LoRA)
    where the embedding trained whole (``lora_train_embedding``) must be merged. Where the model ties the output
    layer to the input embedding, the update changes the logits only: the input embedding stays the base one.
    The engines serve it from their slots; merging it (``pipeline.weight_sync = "merged"``) is refused, as the
    merge would write the tied embedding too."""

    @property
    def lora_modules(self) -> list[str]:
        """The modules the adapter covers: ``lora_target_modules``, and the output layer (:data:`OUTPUT_LAYER`)
        with ``lora_train_unembed``."""
        return [*self.lora_target_modules, *([OUTPUT_LAYER] if self.lora_train_unembed else [])]

    @property
    def lora_trains_whole(self) -> bool:
        """Whether a LoRA adapter also carries tensors trained whole (norms, embedding): vLLM's LoRA slots
        cannot serve it, the engines merge it."""
        return self.lora and (self.lora_train_norms or self.lora_train_embedding)
    lr: float = Field(2e-4, gt=0.0)
    """AdamW learning rate. 2e-4 suits LoRA; full fine-tuning wants 1e-6 to 1e-5 (a run config that sets no
    lr gets one: see ``agentrl.config.presets``)."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """How the learning rate moves after the warm-up: held at ``lr`` (``constant``), or decayed to
    ``lr * lr_min_ratio`` by optimizer step ``lr_decay_steps`` along a half cosine or a line."""
    lr_warmup_steps: int = Field(0, ge=0)
    """Optimizer steps of linear warm-up from ``lr / lr_warmup_steps`` to ``lr`` (0: none)."""
    lr_decay_steps: int = Field(0, ge=0)
    """The optimizer step at which a decaying schedule reaches its floor. 0 in a run config means the run's
    last step (``steps x ppo_epochs x num_minibatches``)."""
    lr_min_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """The floor of a decaying schedule, as a fraction of ``lr``."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    adam_eps: float = Field(1e-8, gt=0.0)
    """AdamW epsilon."""
    grad_clip: float = Field(1.0, ge=0.0)
    """Clip the global gradient norm to this value; 0 disables clipping (the norm is still reported)."""
    micro_batch_tokens: int = Field(4096, ge=1)
    """Token budget of one forward/backward, which bounds its activation memory: the length of one packed
    row (``packing``), or padded ``batch * max_len``. A sample longer than this is refused (a run checks
    ``sampling.max_context_tokens`` against it before it starts). A run that does not set it takes the larger
    of this default and its window, so that one whole episode fits (``RunConfig.micro_batch_budget``)."""
    logprob_chunk_tokens: int = Field(1024, ge=0)
    """Positions whose logits exist at once while the trainer scores tokens: the output layer and the
    log-softmax run fused, this many positions at a time, and keep one number per position instead of the
    ``positions x vocabulary`` logits (``agentrl.trainer.head``), so a real vocabulary fits. 0 runs the model's
    own output layer over the whole micro-batch (models whose forward changes the logits after it, by a
    soft-cap or a scale, always do)."""
    packing: bool = True
    """Pack several samples into each micro-batch's single row, with position ids restarting per sample and
    attention kept inside each sample (no padding). False pads each micro-batch to its longest sample."""
    share_prefix: bool = True
    """With ``packing``: samples of a packed row that open on the same prompt (a GRPO group's episodes) hold it
    once, and each one's rest attends to it (``agentrl.trainer.packing``): the same logprobs and gradients for
    a fraction of the tokens when prompts are long (system prompt, tool list). Dense models under SDPA without
    a sliding window; others pack each sample whole."""
    balance_ranks: bool = True
    """Deal each minibatch to the ranks by compute cost (tokens, plus their attention's quadratic share),
    largest first to the least loaded rank, so the slowest rank is not the one with the longest samples.
    False deals ``samples[rank::world]``."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each ``train`` batch."""
    num_minibatches: int = Field(1, ge=1)
    """Optimizer steps per epoch: the batch is split into this many minibatches."""
    loss: LossConfig = Field(default_factory=LossConfig)
    """Policy-loss settings."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype of forward/backward; parameters, gradients reduction and optimizer stay float32."""
    seed: int = 0
    """Seed for LoRA initialisation (identical on every rank) and the RNGs. In a run config, unset means the
    run's ``seed``."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto``: CUDA when available (one GPU per local rank), else CPU with the gloo backend."""
    gradient_checkpointing: bool = False
    """Recompute decoder-layer activations in backward to save memory."""
    routing_replay: bool = True
    """MoE models: force each router to the experts the engine chose for every token (recorded with the
    rollout), so the trainer scores the network that sampled. False lets the trainer's routers choose (for
    comparison; the mismatch with the engine is still measured). No effect on dense models."""
    attn_implementation: str = "sdpa"
    """Attention implementation passed to ``from_pretrained`` (``sdpa``, ``eager``, ``flash_attention_2``)."""
    cpu_cores: str | None = Field(None, pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$")
    """CPU only: run the trainer processes on these cores (a ``taskset`` list such as ``"1"`` or ``"2-3"``),
    with one intra-op thread per core, apart from an inference server pinned elsewhere."""
    heartbeat_s: float = Field(60.0, gt=0.0)
    """While idle, rank 0 wakes the other ranks this often so their collectives never hit the timeout."""
    collective_timeout_s: float = Field(1800.0, gt=0.0)
    """Timeout of every collective (process-group timeout)."""
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    """Nodes of the trainer job and how they meet (one node by default)."""

    @model_validator(mode="after")
    def _check_frozen(self) -> TrainerSettings:
        if self.frozen_parameters and self.lora:
            raise SettingError("trainer.frozen_parameters applies to full-weight training (trainer.lora = false); "
                               "a LoRA adapter already leaves every base weight frozen")
        for name in ("lora_train_norms", "lora_train_embedding", "lora_train_unembed"):
            if getattr(self, name) and not self.lora:
                raise SettingError(f"trainer.{name} extends a LoRA adapter (trainer.lora = true); full-weight "
                                   "training (trainer.lora = false) trains those weights already")
        if self.lora_train_unembed and self.lora_train_embedding:
            raise SettingError("trainer.lora_train_unembed and trainer.lora_train_embedding both train the output layer "
                               "(the embedding trained whole, tied to it, is served merged; the output layer's LoRA "
                               "from the slots): choose one")
        if self.lora_train_unembed and self.lora_train_norms:
            raise SettingError("trainer.lora_train_unembed is served from the LoRA slots, trainer.lora_train_norms "
                               "merged (the slots hold no norm): no engine serves both; choose one")
        return self


class TrainerConfig(TrainerSettings):
    """Everything the trainer worker needs; sent to it as JSON."""

    model_path: str
    """Local directory (or hub id) of the Hugging Face causal LM to train."""
