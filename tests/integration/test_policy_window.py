"""`agentrl serve-policy --model DIR` serves the model's own window (the tiny model's 2,048 tokens), not an
environment preset's (calc's 1,024): a prompt between the two is answered."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "policy-window-token-0123456789"


def _serve(model: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve-policy", "--model", str(model), "--port", "0",
                             "--token", TOKEN, *extra],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True)


@contextlib.contextmanager
def serving(model: Path, *extra: str) -> Iterator[str]:
    """``agentrl serve-policy`` on ``model`` until the block ends: its URL; a clean block also checks that it
    stops cleanly on SIGTERM, and it is killed (its process group) whatever happens."""
    proc = _serve(model, *extra)
    try:
        yield _url(proc)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _url(proc: subprocess.Popen) -> str:
    lines = []
    for line in proc.stderr:  # type: ignore[union-attr]
        lines.append(line)
        if (found := re.search(r"policy endpoint: (http://\S+)/v1", line)):
            return found.group(1)
    proc.wait(timeout=30)
    raise AssertionError("agentrl serve-policy stopped before serving:\n" + "".join(lines))


def _long_prompt(model: Path, low: int, high: int) -> str:
    """A user message whose prompt is between ``low`` and ``high`` tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)

    def tokens(text: str) -> int:  # the rendered prompt's length (the template rendered as text, then counted)
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
        return len(tok(rendered, add_special_tokens=False)["input_ids"])

    words = ["apple", "pear", "seven", "plus", "box"]
    text = ""
    while tokens(text) < low:
        text += " ".join(words) + " "
    assert tokens(text) < high
    return text


@pytest.mark.timeout(900)
def test_serve_policy_serves_the_models_window(tiny_model_dir: Path) -> None:
    import httpx

    prompt = _long_prompt(tiny_model_dir, 1300, 1900)  # more than calc's 1,024, less than the model's 2,048
    with serving(tiny_model_dir) as url, httpx.Client(timeout=600) as h:
        ep = h.post(f"{url}/v1/episodes", json={}, headers={"Authorization": f"Bearer {TOKEN}"}).json()
        r = h.post(f"{ep['base_url']}/chat/completions", headers={"Authorization": f"Bearer {ep['api_key']}"},
                   json={"model": "x", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert 1300 <= r.json()["usage"]["prompt_tokens"] < 1900
