"""Training samples, padding into tensors, and micro-batching by a token budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class TrainSample:
    """One training sequence: the prompt and completion ids, aligned per position.

    ``behav_logprobs[t]`` is the behaviour policy's ``log p(input_ids[t] | input_ids[:t])`` (0 where the
    mask is 0), the same convention as :func:`agentrl.loss.token_logprobs`.
    """

    input_ids: list[int]
    """Token ids of the whole sequence (prompt + completion)."""
    loss_mask: list[int]
    """1 on model-generated tokens (trained on), 0 on prompt, tool and template tokens."""
    behav_logprobs: list[float]
    """Logprob of each token under the policy that sampled it; 0.0 where the mask is 0."""
    advantage: float
    """The sequence's advantage (e.g. GRPO group-normalised reward)."""
    versions: list[int]
    """Policy version that generated each token; -1 where the mask is 0."""
    temperature: float = 1.0
    """Sampling temperature of the masked tokens: logprobs are of ``softmax(logits / temperature)``."""

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if n == 0:
            raise ValueError("TrainSample.input_ids is empty")
        if not self.temperature > 0:
            raise ValueError(f"TrainSample.temperature must be > 0 (got {self.temperature}): greedy "
                             "generations have no sampling distribution to train")
        for name in ("loss_mask", "behav_logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TrainSample.{name} has {len(getattr(self, name))} entries, expected {n}")
        if self.loss_mask[0]:
            raise ValueError("TrainSample.loss_mask[0] must be 0: the first token has no context")

    @property
    def num_loss_tokens(self) -> int:
        """Number of positions with a loss mask of 1."""
        return sum(1 for m in self.loss_mask if m)


def collate(samples: Sequence[TrainSample], pad_id: int) -> dict[str, Tensor]:
    """Right-pad samples into ``input_ids_B_T``, ``attention_mask_B_T``, ``loss_mask_B_T``,
    ``behav_logprobs_B_T`` (float32), ``versions_B_T``, ``advantages_B`` and ``temperatures_B`` (float32)."""
    if not samples:
        raise ValueError("collate() needs at least one sample")
    B = len(samples)
    T = max(len(s.input_ids) for s in samples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T), dtype=torch.float32)
    behav = torch.zeros((B, T), dtype=torch.float32)
    versions = torch.full((B, T), -1, dtype=torch.long)
    for b, s in enumerate(samples):
        n = len(s.input_ids)
        input_ids[b, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        attention[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        behav[b, :n] = torch.tensor(s.behav_logprobs, dtype=torch.float32)
        versions[b, :n] = torch.tensor(s.versions, dtype=torch.long)
    behav = behav * loss_mask
    return {
        "input_ids_B_T": input_ids,
        "attention_mask_B_T": attention,
        "loss_mask_B_T": loss_mask,
        "behav_logprobs_B_T": behav,
        "versions_B_T": versions,
        "advantages_B": torch.tensor([float(s.advantage) for s in samples], dtype=torch.float32),
        "temperatures_B": torch.tensor([float(s.temperature) for s in samples], dtype=torch.float32),
    }


def micro_batches(samples: Sequence[TrainSample], max_tokens: int) -> list[list[int]]:
    """Group sample indices so each padded micro-batch (``len * max length``) fits ``max_tokens``.

    Samples are taken longest first, which keeps padding low; a sample longer than the budget gets a
    micro-batch of its own. Deterministic for a given input.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be positive")
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].input_ids), i))
    groups: list[list[int]] = []
    current: list[int] = []
    current_max = 0
    for i in order:
        n = len(samples[i].input_ids)
        new_max = max(current_max, n)
        if current and new_max * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, new_max = [], n
        current.append(i)
        current_max = new_max
    if current:
        groups.append(current)
    return groups


def shard(samples: Sequence[TrainSample], rank: int, world: int) -> list[TrainSample]:
    """This rank's share of a batch: ``samples[rank::world]``."""
    return list(samples[rank::world])


def split_minibatches(samples: Sequence[TrainSample], n: int) -> list[list[TrainSample]]:
    """Split a batch into ``n`` contiguous, near-equal minibatches (one optimizer step each); empty ones
    are left out."""
    size, extra = divmod(len(samples), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        if end > start:
            out.append(list(samples[start:end]))
        start = end
    return out
