"""Peak resident memory of every trainer rank: ``python -m agentrl.tools.bench.trainer_memory``.

Starts a real ``torchrun`` LoRA trainer (CPU, gloo) on a random Qwen2 of a named shape (or ``--model DIR``),
reads each rank's peak RSS (``VmHWM``) once the trainer is ready, resets it, runs one training step on a fixed
batch of ``--tokens`` tokens (its loss shows that the weights arrived) and reads the peak again: the step's own.
Prints one JSON object as the last line: ``peak_rss_mb`` per rank (the build), ``step_peak_rss_mb`` per rank,
the model's fp32 size (what each rank held before sharding when every rank loaded the whole model), and the
step's loss. ``--compare-logprob-chunk`` runs the step twice, on two trainers one after the other: with the
fused output layer (``trainer.logprob_chunk_tokens``, the default) and with the model's own (0), whose logits
of the whole micro-batch exist at once; ``step_peak_ratio`` is the second's step peak over the first's. Linux
only (``/proc``).
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

from agentrl.core.utils.procs import process_table
from agentrl.tools.bench.models import SIZES, build_random_qwen2


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


def _reset_peaks(torchrun_pid: int) -> None:
    """Reset the peak RSS of the workers of one torchrun launcher (``/proc/PID/clear_refs``, value 5)."""
    for pid in _children(torchrun_pid):
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            continue


def _batch(vocab: int, tokens: int = 0) -> list[Any]:
    """Four samples of 24 to 36 tokens, or, with ``tokens``, four that fill ``tokens`` in all."""
    from agentrl.core.types import TrainSample

    rng = random.Random(0)
    out = []
    for i in range(4):
        n = tokens // 4 if tokens else 24 + 4 * i
        prompt = min(8, n // 2)
        mask = [0] * prompt + [1] * (n - prompt)
        out.append(TrainSample(input_ids=[rng.randrange(3, vocab) for _ in range(n)], loss_mask=mask,
                               behav_logprobs=[-6.0 if m else 0.0 for m in mask], advantage=0.5 + 0.25 * i,
                               versions=[0 if m else -1 for m in mask]))
    return out


def measure(model_dir: Path, nproc: int, work: Path, tokens: int = 0, logprob_chunk: int | None = None,
            threads: int = 1) -> dict[str, Any]:
    """Start the trainer, read its ranks' peak RSS, run one step (of ``tokens`` tokens, in one micro-batch) and
    read the step's own peak; the JSON-ready result."""
    from safetensors import safe_open

    from agentrl.config.trainer import TrainerConfig
    from agentrl.trainer.client import TrainerProcess
    from agentrl.trainer.messages import Ping

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        numel = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    extra = {} if logprob_chunk is None else {"logprob_chunk_tokens": logprob_chunk}
    cfg = TrainerConfig(model_path=str(model_dir), device="cpu", micro_batch_tokens=max(64, tokens),
                        heartbeat_s=5.0, **extra)
    tp = TrainerProcess(cfg, work, nproc=nproc, env={"OMP_NUM_THREADS": str(threads)})
    tp.start()
    try:
        assert tp.proc is not None
        tp.request(Ping(), timeout_s=600)  # every rank has finished building once it answers
        peaks = _rank_peaks(tp.proc.pid)
        _reset_peaks(tp.proc.pid)
        metrics = asyncio.run(tp.train(_batch(vocab, tokens), policy_version=0))
        step_peaks = _rank_peaks(tp.proc.pid)
    finally:
        tp.close()
    return {"nproc": nproc, "model_params": numel, "model_fp32_mb": round(numel * 4 / 2**20, 1),
            "peak_rss_mb": [peaks.get(r) for r in range(nproc)], "step_peak_rss_mb": [step_peaks.get(r) for r in range(nproc)],
            "step_loss_tokens": metrics["num_tokens"], "logprob_chunk_tokens": cfg.logprob_chunk_tokens,
            "loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "train_time_s": metrics.get("time_s")}


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
    parser = argparse.ArgumentParser(prog="python -m agentrl.tools.bench.trainer_memory", description=__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b", help="random Qwen2 shape")
    parser.add_argument("--nproc", type=int, default=2, help="trainer ranks (CPU)")
    parser.add_argument("--model-dir", type=Path, default=None, help="where to build (or reuse) the model")
    parser.add_argument("--checkpoint-dtype", choices=["float32", "bfloat16"], default="bfloat16",
                        help="dtype of the saved weights (released checkpoints are bfloat16; fp32 ones are "
                             "memory-mapped, so a rank only pays for the pages it reads)")
    parser.add_argument("--model", type=Path, default=None, help="a model directory to train instead of a random Qwen2")
    parser.add_argument("--tokens", type=int, default=0, help="tokens of the step's batch, in one micro-batch "
                        "(default: four samples of 24 to 36 tokens)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--compare-logprob-chunk", action="store_true",
                        help="run the step with the fused output layer and with the model's own, side by side")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="agentrl-trainer-mem-") as tmp:
        if args.model is not None:
            model_dir, res = args.model, {"model": str(args.model)}
        else:
            model_dir = args.model_dir or Path(tmp) / "model"
            build_random_qwen2(model_dir, args.size)
            if args.checkpoint_dtype == "bfloat16":
                model_dir = _bf16_copy(model_dir, model_dir.with_name(model_dir.name + "-bf16"))
            res = {"size": args.size, "checkpoint_dtype": args.checkpoint_dtype}
        res.update(measure(model_dir, args.nproc, Path(tmp) / "run", args.tokens, threads=args.threads))
        if args.compare_logprob_chunk:
            plain = measure(model_dir, args.nproc, Path(tmp) / "run-plain", args.tokens, logprob_chunk=0,
                            threads=args.threads)
            res["plain"] = {k: plain[k] for k in ("step_peak_rss_mb", "loss", "grad_norm", "train_time_s")}
            res["step_peak_ratio"] = max(plain["step_peak_rss_mb"]) / max(res["step_peak_rss_mb"])
            res["loss_rel_diff"] = abs(plain["loss"] - res["loss"]) / max(abs(plain["loss"]), 1e-12)
    print(f"{args.nproc} ranks, model {res['model_fp32_mb']} MiB fp32: peak RSS per rank {res['peak_rss_mb']} MiB, "
          f"during a step ({res['step_loss_tokens']} loss tokens) {res['step_peak_rss_mb']} MiB; loss {res['loss']:.6f}",
          file=sys.stderr)
    if "plain" in res:
        print(f"without the fused output layer: {res['plain']['step_peak_rss_mb']} MiB during the step "
              f"({res['step_peak_ratio']:.2f}x)", file=sys.stderr)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
