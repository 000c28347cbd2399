"""Peak resident memory of every trainer rank while the model is built: ``python -m agentrl.bench.trainer_memory``.

Starts a real ``torchrun`` LoRA trainer (CPU, gloo) on a random Qwen2 of a named shape, reads each rank's
peak RSS (``VmHWM``) once the trainer is ready, runs one training step on a fixed batch (its loss shows
that the weights arrived), and prints one JSON object as the last line: ``peak_rss_mb`` per rank, the
model's fp32 size (what each rank held before sharding when every rank loaded the whole model), and
the step's loss. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from agentrl.bench.models import SIZES, build_random_qwen2
from agentrl.utils.procs import process_table


def _children(pid: int) -> list[int]:
    return [child for child, (parent, _, _) in process_table().items() if parent == pid]


def _rank_peaks(torchrun_pid: int) -> dict[int, float]:
    """Rank -> peak RSS in MiB of the workers of one torchrun launcher."""
    peaks = {}
    for pid in _children(torchrun_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
        hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), None)
        if rank is not None and hwm is not None:
            peaks[rank] = round(hwm / 1024, 1)
    return dict(sorted(peaks.items()))


def _batch(vocab: int) -> list[Any]:
    from agentrl.types import TrainSample

    rng = random.Random(0)
    out = []
    for i in range(4):
        n, prompt = 24 + 4 * i, 8
        mask = [0] * prompt + [1] * (n - prompt)
        out.append(TrainSample(input_ids=[rng.randrange(3, vocab) for _ in range(n)], loss_mask=mask,
                               behav_logprobs=[-6.0 if m else 0.0 for m in mask], advantage=0.5 + 0.25 * i,
                               versions=[0 if m else -1 for m in mask]))
    return out


def measure(model_dir: Path, nproc: int, work: Path) -> dict[str, Any]:
    """Start the trainer, read its ranks' peak RSS, run one step; the JSON-ready result."""
    from safetensors import safe_open

    from agentrl.config.trainer import TrainerConfig
    from agentrl.trainer.client import TrainerProcess

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        numel = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    cfg = TrainerConfig(model_path=str(model_dir), device="cpu", micro_batch_tokens=64, heartbeat_s=5.0)
    tp = TrainerProcess(cfg, work, nproc=nproc, env={"OMP_NUM_THREADS": "1"})
    tp.start()
    try:
        assert tp.proc is not None
        tp.request("ping", timeout_s=600)  # every rank has finished building once it answers
        peaks = _rank_peaks(tp.proc.pid)
        metrics = asyncio.run(tp.train(_batch(vocab), policy_version=0))
    finally:
        tp.close()
    return {"nproc": nproc, "model_params": numel, "model_fp32_mb": round(numel * 4 / 2**20, 1),
            "peak_rss_mb": [peaks.get(r) for r in range(nproc)], "loss": metrics["loss"],
            "grad_norm": metrics["grad_norm"]}


def _bf16_copy(src: Path, dst: Path) -> Path:
    """The same model saved in bfloat16, as released checkpoints are (the trainer loads it as float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    if not (dst / "model.safetensors").is_file():
        AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16).save_pretrained(str(dst))
        for f in src.glob("tokenizer*"):
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _prod(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(prog="python -m agentrl.bench.trainer_memory", description=__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b", help="random Qwen2 shape")
    parser.add_argument("--nproc", type=int, default=2, help="trainer ranks (CPU)")
    parser.add_argument("--model-dir", type=Path, default=None, help="where to build (or reuse) the model")
    parser.add_argument("--checkpoint-dtype", choices=["float32", "bfloat16"], default="bfloat16",
                        help="dtype of the saved weights (released checkpoints are bfloat16; fp32 ones are "
                             "memory-mapped, so a rank only pays for the pages it reads)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="agentrl-trainer-mem-") as tmp:
        model_dir = args.model_dir or Path(tmp) / "model"
        build_random_qwen2(model_dir, args.size)
        if args.checkpoint_dtype == "bfloat16":
            model_dir = _bf16_copy(model_dir, model_dir.with_name(model_dir.name + "-bf16"))
        res = {"size": args.size, "checkpoint_dtype": args.checkpoint_dtype,
               **measure(model_dir, args.nproc, Path(tmp) / "run")}
    print(f"{args.nproc} ranks, model {res['model_fp32_mb']} MiB fp32: peak RSS per rank {res['peak_rss_mb']} MiB; "
          f"loss {res['loss']:.6f}", file=sys.stderr)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
