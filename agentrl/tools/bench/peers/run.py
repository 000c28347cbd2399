"""One seed of ``agentrl bench peers``: the same work through agentrl and through the peer, then one evaluation.

For each seed: agentrl trains with ``agentrl train`` (a child process, as a user runs it); the peer trains in
its own child process (:mod:`agentrl.tools.bench.peers.trl_side`) on the same model, the same sequence of
tasks (agentrl's seeded draw, :func:`agentrl.environment.tasks.task_rng`), the same prompts and tool schemas,
and the settings mapped from the same run config (:mod:`agentrl.tools.bench.peers.settings`); the order of
the two alternates between seeds. Then agentrl's evaluator scores the base model and both final models on
the same held-out tasks (each a plain Hugging Face directory: a trained LoRA adapter, agentrl's or the
peer's, is merged into the base model first, the same way for both, by :func:`merge_adapter`).

The time a framework is charged is its training loop only, from the start of its first step to the end of
its last (start-up and evaluations apart): agentrl's ``wall_train_s``, TRL's first ``on_step_begin`` to last
``on_step_end``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentrl.tools.bench.errors import BenchFailed


def _tail(path: Path, n: int = 3) -> str:
    lines = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    return " | ".join(lines[-n:]) or "no output"


def _child(cmd: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None) -> None:
    """Run ``cmd`` to its end, its output in ``log``, owned by this process (its group ends with this one,
    however this one ends). A failure raises with the log's tail."""
    from agentrl.core.utils.lifeline import own_process, release_process

    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        own_process(proc.pid)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise BenchFailed(f"{cmd[2]} ran past {timeout_s:.0f} s (log: {log})") from None
        except BaseException:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise
        finally:
            release_process(proc.pid)
    if rc != 0:
        raise BenchFailed(f"{' '.join(cmd[:4])} ... exited with {rc}: {_tail(log)} (log: {log})")


def merge_adapter(base: str | Path, adapter: str | Path, out: Path) -> Path:
    """A plain Hugging Face directory at ``out``: the peft LoRA adapter ``adapter`` merged into the model
    ``base`` (``W0 + scaling * B @ A``, in float32: ``agentrl export``'s merge), with the base's tokenizer files,
    chat template and generation config. Written beside ``out`` and renamed into place."""
    import shutil

    from agentrl.core.utils.atomic import replace_dir
    from agentrl.launch.export import merge_into, save_model

    base, out = Path(base), Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(merge_into(base, adapter), base, tmp)
    replace_dir(tmp, out)
    return out


def _plain_model(cfg: Any, trained: str) -> str:
    """The directory the evaluator scores for a final policy: ``trained`` itself (a whole model) or, for a
    LoRA adapter, the adapter merged into ``cfg.model`` beside it (``<adapter>-merged``)."""
    path = Path(trained)
    if not (path / "adapter_config.json").is_file():
        return trained
    return str(merge_adapter(cfg.model, path, path.with_name(f"{path.name}-merged")))


def run_agentrl(cfg: Any, work: Path, timeout_s: float) -> dict[str, Any]:
    """``agentrl train`` with ``cfg`` (written out as its TOML), summarised from its metrics."""
    toml = work / "agentrl.toml"
    toml.write_text(cfg.to_toml())
    _child([sys.executable, "-c", "from agentrl.cli import app; app()", "train", "--config", str(toml)],
           work / "agentrl.log", timeout_s)
    from agentrl.orchestrator.metrics import records_of

    train = records_of(cfg.run_dir / "metrics.jsonl", "train")
    if len(train) != cfg.steps:
        raise BenchFailed(f"agentrl ran {len(train)} of {cfg.steps} steps (metrics: {cfg.run_dir / 'metrics.jsonl'})")
    return {
        "framework": "agentrl", "generation": "vLLM server",
        "steps": [{"s": r["step_s"], "gen_s": r["gen_s"], "model_tokens": r["model_tokens"],
                   "batch_tokens": r["total_tokens"], "episodes": r["num_episodes"]} for r in train],
        "loop_s": train[-1]["wall_train_s"],
        "rewards": [r["reward_mean"] for r in train],
        "final_model": str(cfg.final_policy_dir),
    }


def prompts_of(env_cls: Any, tasks: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The opening messages agentrl's episode gives the model for each task (its own ``Episode.open``): the
    peer's dataset prompts."""
    from agentrl.rollout.episode import Episode

    async def one(task: dict[str, Any]) -> list[dict[str, Any]]:
        episode = Episode(env_cls, task)
        try:
            return [m.to_openai() for m in await episode.open()]
        finally:
            await episode.close()

    async def all_() -> list[list[dict[str, Any]]]:
        return [await one(t) for t in tasks]

    return asyncio.run(all_())


def run_trl(cfg: Any, env_cls: Any, tasks: list[dict[str, Any]], trl_path: Path, generation: str, work: Path,
            timeout_s: float) -> dict[str, Any]:
    """TRL's GRPO on the same work, in a child process with TRL on its path."""
    from agentrl.launch.stack import load_chat_format
    from agentrl.tools.bench.peers.settings import trl_config, trl_peft

    out = work / "trl"
    out.mkdir(parents=True, exist_ok=True)
    prompts = prompts_of(env_cls, tasks)
    chat = load_chat_format(str(cfg.model), cfg.tool_parser, cfg.chat_template)
    tools = env_cls.tool_schemas()
    spec = {"env": cfg.env, "model": str(cfg.model), "seed": cfg.seed, "tasks": tasks, "prompts": prompts,
            "chat_template": chat.tokenizer.chat_template, "stop_token_ids": list(chat.stop_token_ids),
            # what agentrl sends the engine for the first tasks: the peer's rendering is checked against it
            "prompt_ids": [chat.prompt_ids(p, tools) for p in prompts[:4]],
            "out_dir": str(out), "result": str(out / "result.json"),
            "trl_config": trl_config(cfg, env_cls, out_dir=str(out), generation=generation),
            "peft": trl_peft(cfg)}
    (out / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(trl_path.resolve()), env.get("PYTHONPATH")) if p)
    _child([sys.executable, "-m", "agentrl.tools.bench.peers.trl_side", str(out / "spec.json")], work / "trl.log",
           timeout_s, env=env)
    return json.loads((out / "result.json").read_text())


def evaluate_models(cfg: Any, models: dict[str, str], n: int) -> dict[str, dict[str, Any]]:
    """agentrl's evaluator on the first ``n`` held-out tasks, for each model directory by name."""
    from agentrl.orchestrator.evaluate import run_eval

    out = {}
    for name, model in models.items():
        # a whole model directory, as a full-weight run's engines serve it (its transport settled anew)
        one = cfg.with_changes({"model": model, "trainer.lora": False, "pipeline.weight_sync": "auto",
                                "output_dir": str(cfg.run_dir / "eval"), "name": name})
        res = asyncio.run(run_eval(one, n=n, temperature=cfg.eval_temperature))
        out[name] = {"success": res["success"], "n": res.get("num_tasks", n)}
    return out


def run_seed(cfg: Any, trl_path: Path, *, generation: str, eval_n: int, peer_first: bool,
             timeout_s: float) -> dict[str, Any]:
    """Both frameworks on ``cfg``'s work (a resolved agentrl run config), then the evaluations."""
    from agentrl.environment.registry import load_env
    from agentrl.environment.tasks import load_tasks, task_rng

    env_cls = load_env(cfg.env)
    train = load_tasks(env_cls, "train", cfg.tasks, source_split=cfg.tasks_split, columns=cfg.task_columns)
    rng = task_rng(cfg.seed, 0)
    tasks = [rng.choice(train) for _ in range(cfg.steps * cfg.tasks_per_step)]
    work = cfg.run_dir.parent / f"{cfg.name}-work"
    work.mkdir(parents=True, exist_ok=True)
    order = ["trl", "agentrl"] if peer_first else ["agentrl", "trl"]
    results: dict[str, dict[str, Any]] = {}
    for side in order:
        if side == "agentrl":
            results[side] = run_agentrl(cfg, work, timeout_s)
        else:
            results[side] = run_trl(cfg, env_cls, tasks, trl_path, generation, work, timeout_s)
    evals = evaluate_models(cfg, {"base": str(cfg.model),
                                  **{side: _plain_model(cfg, results[side]["final_model"]) for side in order}}, eval_n)
    for side in ("agentrl", "trl"):
        results[side]["success_before"] = evals["base"]["success"]
        results[side]["success_after"] = evals[side]["success"]
    return {"seed": cfg.seed, "order": order, "eval_n": eval_n, **results}
