"""``--adapter`` on eval, serve-policy and serve-env: a saved policy's description fills what no flag gives, and
a base it does not fit is refused before any server starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrl import cli
from agentrl.launch.described import write_description
from tests.unit.launch.test_described import _adapter, _base, _run_cfg


@pytest.fixture
def saved(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(adapter, the base it was trained on, a wider model it does not fit)."""
    monkeypatch.setattr(cli, "_setup", lambda verbose: None)  # keep pytest's own signal handlers
    base, wide = _base(tmp_path / "base"), _base(tmp_path / "wide", hidden=48)
    adapter = _adapter(tmp_path / "a")
    (adapter / "chat_template.jinja").write_text("{{ messages }}")
    write_description(adapter, _run_cfg(tmp_path, base))
    return adapter, base, wide


def test_eval_and_serve_policy_refuse_a_base_the_adapter_does_not_fit(
        monkeypatch: pytest.MonkeyPatch, saved: tuple[Path, Path, Path]) -> None:
    from agentrl.http.policy import run as policy_run
    from agentrl.orchestrator import evaluate

    monkeypatch.setattr(evaluate, "run_eval", lambda *a, **k: pytest.fail("an evaluation started"))
    monkeypatch.setattr(policy_run, "serve_policy", lambda *a, **k: pytest.fail("a server started"))
    adapter, base, wide = saved
    for command in ("eval", "serve-policy"):
        r = CliRunner().invoke(cli.app, [command, "--adapter", str(adapter), "--model", str(wide)])
        assert r.exit_code == 2 and f"does not fit the model {wide}" in r.output and str(base) in r.output, r.output


def test_serve_policy_takes_the_base_template_and_window_from_the_adapter(
        monkeypatch: pytest.MonkeyPatch, saved: tuple[Path, Path, Path]) -> None:
    from agentrl.http.policy import run as policy_run

    seen: dict[str, Any] = {}

    async def serve(cfg: Any, **kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(policy_run, "serve_policy", serve)
    adapter, base, _ = saved
    r = CliRunner().invoke(cli.app, ["serve-policy", "--adapter", str(adapter), "--tool-parser", "llama3_json"])
    assert r.exit_code == 0, r.output
    assert (seen["model"], seen["chat_template"], seen["tool_parser"], seen["adapter"]) == (
        str(base), str(adapter / "chat_template.jinja"), "llama3_json", adapter)  # the flag wins
    assert seen["described"]["sampling"]["max_context_tokens"] == 512


def test_serve_env_renders_with_the_adapters_tokenizer_and_template(
        monkeypatch: pytest.MonkeyPatch, saved: tuple[Path, Path, Path]) -> None:
    from agentrl.http.server import run as server_run

    seen: list[Any] = []
    monkeypatch.setattr(server_run, "serve", seen.append)
    adapter, base, _ = saved
    r = CliRunner().invoke(cli.app, ["serve-env", "--env", "calc", "--adapter", str(adapter)])
    assert r.exit_code == 0, r.output
    assert (seen[0].tokenizers, seen[0].chat_template) == ([str(base)], str(adapter / "chat_template.jinja"))
    r = CliRunner().invoke(cli.app, ["serve-env", "--env", "calc", "--adapter", str(adapter), "--chat-template", "hermes"])
    assert r.exit_code == 0 and seen[1].chat_template == "hermes", r.output
