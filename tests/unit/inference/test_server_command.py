"""The engine's command line: ``--dtype auto`` on the CPU build serves a float32 checkpoint in float32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.inference import VLLMServer, VLLMServerConfig
from agentrl.inference import server as engine


def _model(tmp_path: Path, dtype: str | None, key: str = "dtype") -> str:
    d = tmp_path / f"model-{dtype}-{key}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({key: dtype} if dtype else {}))
    return str(d)


def _dtype(cmd: list[str]) -> str:
    return cmd[cmd.index("--dtype") + 1]


def test_auto_on_the_cpu_build_is_the_float32_checkpoints_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "cpu_build", lambda: True)
    for model, want in [(_model(tmp_path, "float32"), "float32"),
                        (_model(tmp_path, "float32", key="torch_dtype"), "float32"),  # older transformers
                        (_model(tmp_path, "bfloat16"), "auto"), (_model(tmp_path, None), "auto"),
                        ("org/hub-model", "auto")]:
        assert _dtype(VLLMServer(VLLMServerConfig(model=model), tmp_path).build_command()) == want, model
    # a setting is never overridden
    f32 = _model(tmp_path, "float32", key="x")
    (Path(f32) / "config.json").write_text(json.dumps({"dtype": "float32"}))
    assert _dtype(VLLMServer(VLLMServerConfig(model=f32, dtype="bfloat16"), tmp_path).build_command()) == "bfloat16"


def test_auto_on_a_gpu_build_is_left_to_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "cpu_build", lambda: False)
    cmd = VLLMServer(VLLMServerConfig(model=_model(tmp_path, "float32")), tmp_path).build_command()
    assert _dtype(cmd) == "auto"


def test_the_cpu_kv_cache_is_sized_from_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "cpu_build", lambda: True)
    d = tmp_path / "smollm2"
    d.mkdir()
    # SmolLM2-135M: 30 layers, 3 KV heads of 64, float32: 46,080 bytes a token; 128 x 1024 tokens = 5.6 GiB
    (d / "config.json").write_text(json.dumps({"dtype": "float32", "num_hidden_layers": 30, "hidden_size": 576,
                                               "num_attention_heads": 9, "num_key_value_heads": 3,
                                               "vocab_size": 49152, "intermediate_size": 1536}))
    monkeypatch.setattr(engine.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096}.get(name, 64 * 2**30 // 4096))
    cfg = VLLMServerConfig(model=str(d), max_model_len=1024)
    assert engine.kv_cache_gib(cfg) == 6
    assert VLLMServer(cfg, tmp_path)._env()["VLLM_CPU_KVCACHE_SPACE"] == "6"
    assert engine.kv_cache_gib(cfg.model_copy(update={"dtype": "bfloat16"})) == 3  # 2 bytes a value
    assert engine.kv_cache_gib(cfg.model_copy(update={"cpu_kvcache_gb": 2})) == 2  # a setting wins
    # never more than a quarter of the machine's memory (here 16 GiB), never under 1 GiB
    monkeypatch.setattr(engine.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096}.get(name, 16 * 2**30 // 4096))
    assert engine.kv_cache_gib(cfg.model_copy(update={"max_model_len": 8192})) == 4
    assert engine.kv_cache_gib(cfg.model_copy(update={"max_model_len": 16})) == 1
    # never less than one whole sequence, which vLLM needs to start: 200,000 tokens are 8.6 GiB
    assert engine.kv_cache_gib(cfg.model_copy(update={"max_model_len": 200_000})) == 9
    assert engine.kv_cache_gib(VLLMServerConfig(model="org/hub-model")) == 1


def test_the_cpu_build_runs_its_worker_in_the_engine_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def backend(server: VLLMServer) -> tuple[str | None, str | None]:
        cmd = server.build_command()
        flag = cmd[cmd.index("--distributed-executor-backend") + 1] if "--distributed-executor-backend" in cmd else None
        # the engine core is forked from agentrl's entry to vLLM's server only when it hosts the one worker
        module = cmd[cmd.index("-m") + 1]
        assert module == ("agentrl.engine.serve" if flag == "uni" else "vllm.entrypoints.openai.api_server"), cmd
        return flag, server._env().get("VLLM_ENABLE_V1_MULTIPROCESSING")

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    model = _model(tmp_path, "float32")
    monkeypatch.setattr(engine, "cpu_build", lambda: True)
    assert backend(VLLMServer(VLLMServerConfig(model=model), tmp_path)) == ("uni", "0")
    # the user's choice, and tensor parallelism, keep vLLM's worker processes
    mp = VLLMServer(VLLMServerConfig(model=model, extra_args=["--distributed-executor-backend", "mp"]), tmp_path)
    assert backend(mp) == ("mp", None)
    assert backend(VLLMServer(VLLMServerConfig(model=model, tensor_parallel_size=2), tmp_path)) == (None, None)
    monkeypatch.setattr(engine, "cpu_build", lambda: False)  # a GPU build chooses by itself
    assert backend(VLLMServer(VLLMServerConfig(model=model), tmp_path)) == (None, None)


def test_a_lora_runs_engines_wrap_the_layers_its_adapter_trains(tmp_path: Path) -> None:
    from agentrl.config.run import load_config

    def targets(cfg: VLLMServerConfig) -> list[str] | None:
        cmd = VLLMServer(cfg, tmp_path).build_command()
        if "--lora-target-modules" not in cmd:
            return None
        i = cmd.index("--lora-target-modules") + 1
        return cmd[i:next((j for j in range(i, len(cmd)) if cmd[j].startswith("--")), len(cmd))]

    slots = {"env": "calc", "trainer": {"lora_target_modules": ["q_proj", "v_proj"]}}
    cfg = load_config(None, slots).resolved()
    assert cfg.inference.lora_target_modules == ["q_proj", "v_proj", "lm_head"]  # calc's preset: the output layer too
    assert targets(cfg.server_config()) == ["q_proj", "v_proj", "lm_head"]
    # set in [inference], it is kept; a full-weight run that asks for LoRA serving wraps what vLLM can
    mine = load_config(None, {**slots, "inference": {"lora_target_modules": ["o_proj"]}}).resolved()
    assert targets(mine.server_config()) == ["o_proj"]
    full = load_config(None, {"env": "calc", "trainer": {"lora": False}, "inference": {"enable_lora": True}})
    assert full.resolved().inference.lora_target_modules is None and targets(full.resolved().server_config()) is None
    # an engine without LoRA gets no target list
    assert targets(VLLMServerConfig(model="m", enable_lora=False, lora_target_modules=["q_proj"])) is None
