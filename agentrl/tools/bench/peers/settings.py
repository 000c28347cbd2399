"""The settings mapping: one agentrl run config, read once, gives the peer's settings.

agentrl's resolved :class:`~agentrl.config.run.RunConfig` is the one source of the shared settings. Each
function here maps it to a peer's own names, field by field, and :func:`trl_differences` lists what a
mapping cannot make equal (each a sentence under the benchmark's table). A setting the peer has no name for
and that changes the work is a difference, never silently dropped.
"""

from __future__ import annotations

from typing import Any

from agentrl.tools.bench.errors import BenchArgumentError

TRL_VERSION = "1.16.0"
"""The TRL release the benchmark installs and whose settings this module maps to."""


def trl_config(cfg: Any, env_cls: Any, *, out_dir: str, generation: str) -> dict[str, Any]:
    """``trl.GRPOConfig`` keyword arguments for the work of ``cfg`` (a resolved agentrl ``RunConfig``).

    One optimizer step per generation batch of ``tasks_per_step`` tasks x ``group_size`` rollouts (TRL's
    ``steps_per_generation`` defaults to its gradient accumulation, so each task's group is one micro-batch
    and the generation batch is the step's whole batch); the same peak rate, schedule (a half cosine to
    ``lr_min_ratio`` at the last step), AdamW moments, clipping, loss normalisation (token mean over the
    batch: TRL's ``dapo``), per-group advantage scaling, sampling settings, turn limit and precision."""
    t = cfg.trainer
    loss = t.loss
    trl_peft(cfg)  # an adapter the peer cannot train the same way is refused here
    if t.lr_schedule not in ("cosine", "constant") or t.lr_warmup_steps:
        raise BenchArgumentError(f"trainer.lr_schedule {t.lr_schedule!r} with {t.lr_warmup_steps} warm-up steps has no "
                         "mapping to TRL here (cosine or constant, no warm-up)")
    if t.lr_decay_steps != cfg.steps:
        raise BenchArgumentError(f"trainer.lr_decay_steps {t.lr_decay_steps} differs from the run's {cfg.steps} steps: "
                         "TRL's cosine ends at its last step")
    schedule: dict[str, Any] = ({"lr_scheduler_type": "constant"} if t.lr_schedule == "constant" else
                                {"lr_scheduler_type": "cosine_with_min_lr",
                                 "lr_scheduler_kwargs": {"min_lr_rate": t.lr_min_ratio}})
    return {
        "output_dir": out_dir, "seed": cfg.seed, "max_steps": cfg.steps,
        "num_generations": cfg.group_size, "per_device_train_batch_size": cfg.group_size,
        "gradient_accumulation_steps": cfg.tasks_per_step, "shuffle_dataset": False,
        "learning_rate": t.lr, **schedule, "warmup_steps": 0, "optim": "adamw_torch",
        "adam_beta1": t.betas[0], "adam_beta2": t.betas[1], "adam_epsilon": t.adam_eps,
        "weight_decay": t.weight_decay, "max_grad_norm": t.grad_clip,
        "loss_type": "dapo" if loss.aggregation == "token_mean" else "grpo",
        "epsilon": loss.clip_low, "epsilon_high": loss.clip_high, "beta": loss.kl_coef,
        "scale_rewards": "group" if loss.adv_std_normalize else "none",
        "temperature": cfg.sampling.temperature, "top_p": cfg.sampling.top_p,
        "top_k": cfg.sampling.top_k, "min_p": cfg.sampling.min_p or None,
        "max_completion_length": env_cls.max_turns * env_cls.max_tokens_per_turn,
        "max_tool_calling_iterations": env_cls.max_turns - 1,
        "bf16": False, "fp16": False, "use_cpu": t.device == "cpu" or _no_cuda(),
        "gradient_checkpointing": t.gradient_checkpointing, "disable_dropout": True,
        "use_vllm": generation == "vllm", "vllm_mode": "colocate",
        "logging_steps": 1, "report_to": "none", "save_strategy": "no", "remove_unused_columns": False,
    }


def trl_peft(cfg: Any) -> dict[str, Any] | None:
    """``peft.LoraConfig`` keyword arguments for TRL (its ``peft_config``) that train the adapter ``cfg``'s
    trainer trains: the same rank, scaling (``lora_alpha / r``, no rsLoRA), dropout and target modules, no
    bias; None for full-weight training. Tensors trained whole beside agentrl's adapter (norms, the tied
    embedding) are refused: peft's ``modules_to_save`` would train them at the adapter's rate, agentrl at the
    full-weight one, so no setting of TRL's makes the two the same."""
    t = cfg.trainer
    if not t.lora:
        return None
    if t.lora_trains_whole:
        raise BenchArgumentError("the mapping to TRL covers a plain LoRA adapter (trainer.lora_train_norms and "
                                 "trainer.lora_train_embedding false) or full weights")
    return {"r": t.lora_rank, "lora_alpha": t.lora_alpha, "lora_dropout": t.lora_dropout,
            "target_modules": list(t.lora_target_modules), "bias": "none", "use_rslora": False,
            "task_type": "CAUSAL_LM"}


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def trl_differences(cfg: Any, env_cls: Any, generation: str) -> list[str]:
    """What the mapping cannot make equal between agentrl running ``cfg`` and TRL, one sentence each."""
    out = [
        f"Turns and tokens: agentrl caps each assistant turn at {env_cls.max_tokens_per_turn} tokens and the episode "
        f"at {cfg.sampling.max_context_tokens} tokens of context; TRL caps the whole multi-turn completion at "
        f"{env_cls.max_turns * env_cls.max_tokens_per_turn} tokens, tool results included (neither cap binds on "
        "most calc episodes).",
        "A malformed tool call: agentrl answers with an error and gives the model another turn (at most "
        f"{cfg.sampling.max_parse_errors} in an episode); TRL reads it as a plain final answer and ends the episode.",
        "A tool error: agentrl returns the tool's message as the observation; TRL returns {\"error\": message}.",
        "Groups whose rollouts all score the same: agentrl drops them before training; TRL keeps their tokens in "
        "the loss denominator, which scales down every other token's gradient.",
        "Importance correction: agentrl corrects the engine-vs-trainer logprob mismatch per token (truncated IS); "
        "TRL " + ("corrects it the same way (vLLM's sampling logprobs)." if generation == "vllm" else
                  "samples with the trainer's own weights (transformers generate), so there is none to correct."),
        "Training batches: agentrl packs the step's samples into micro-batches of "
        f"{cfg.trainer.micro_batch_tokens} tokens; TRL pads one group of {cfg.group_size} rollouts per micro-batch.",
        "Precision: both in float32; agentrl's engine (vLLM) samples in float32 too"
        + ("." if generation == "vllm" else ", TRL samples with transformers generate in float32."),
    ]
    if cfg.trainer.lora:
        out.append(f"LoRA: the same adapter on both sides through peft (rank {cfg.trainer.lora_rank}, alpha "
                   f"{cfg.trainer.lora_alpha:g}, {', '.join(cfg.trainer.lora_target_modules)}), each initialised "
                   "from its own framework's random draw; agentrl's engine generates on the base weights with the "
                   "adapter merged into them at each sync (pipeline.weight_sync = merged), TRL generates through "
                   "the peft model; both final adapters are merged into the base model the same way for the "
                   "evaluation.")
    if cfg.mode == "async":
        out.append(f"Overlap: agentrl runs async (generation overlaps training; a group's head at most "
                   f"{cfg.pipeline.max_staleness} versions behind when trained, each token at most "
                   f"{cfg.pipeline.token_age_cap()}, corrected per token); TRL generates and trains in turn, on-policy.")
    return out


WEIGHTS = ("full", "lora")
"""What both frameworks train: every weight, or a plain LoRA adapter (peft's, on the trainer's target modules)."""


def agentrl_overrides(*, model: str, steps: int, tasks_per_step: int, group_size: int, seed: int,
                      output_dir: str, name: str, mode: str = "sync", weights: str = "full") -> dict[str, Any]:
    """The run settings the benchmark gives ``agentrl train`` (over the ``calc`` preset): no checkpoints, no
    time limit, no evaluation inside the run's step loop (both final models are evaluated alike afterwards).
    ``mode``: the run's ``mode`` (``sync``, the training default; ``async`` at the pipeline's default bound).
    ``weights``: ``full`` trains every weight (``--full``, at the preset's full-weight rate), ``lora`` the
    trainer's default adapter (every linear layer) at its LoRA rate, with no tensor trained whole beside it
    (agentrl's recipe for the embedded model also trains the tied embedding, which has no peft mapping at the
    same rate), served merged into the engine's weights (agentrl's fastest way to generate with an adapter
    on a CPU)."""
    if weights not in WEIGHTS:
        raise BenchArgumentError(f"weights {weights!r}: one of {', '.join(WEIGHTS)}")
    trainer: dict[str, Any] = {"lora": weights == "lora", "lr_decay_steps": steps}
    over: dict[str, Any] = {
        "env": "calc", "model": model, "steps": steps, "tasks_per_step": tasks_per_step, "group_size": group_size,
        "seed": seed, "output_dir": output_dir, "name": name, "eval_every": 0, "checkpoint_every": 0,
        "time_limit_min": 10_000.0, "mode": mode, "trainer": trainer,
    }
    if weights == "lora":
        trainer.update(lora_train_norms=False, lora_train_embedding=False)
        over["pipeline"] = {"weight_sync": "merged"}
    return over
