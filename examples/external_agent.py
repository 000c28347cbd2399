"""An agent outside agentrl: it plays an environment served by ``agentrl serve-env`` using only ``openai``
(to sample from any OpenAI-compatible server) and ``httpx`` (to talk to the environment server).

.. doc-test: skip: two servers that run until stopped; tests/integration/test_env_server_e2e.py runs this example against both

Start the servers (any OpenAI-compatible model server works; here the embedded model on vLLM)::

    agentrl serve-env --env calc --port 8765            # prints the bearer token
    python -m vllm.entrypoints.openai.api_server --model models/tiny --served-model-name base --port 8000

.. doc-test: skip: needs the two servers above and the token the first one printed

then::

    export AGENTRL_ENV_TOKEN=<the token>
    python examples/external_agent.py --env-url http://127.0.0.1:8765 --base-url http://127.0.0.1:8000/v1 \\
        --model base --episodes 8

Each episode: open a session on a task, give the model the session's messages and tools, send each
assistant message to ``step`` as it is, append the returned tool messages, until ``done``; then close.
With ``--server-side`` the environment server runs the whole episode itself against the model server
(``POST /v1/rollouts``, which needs ``serve-env --tokenizer``) and returns the token-level trajectory.
The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from typing import Any

import httpx
import openai

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_hermes_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Tool calls written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in the text (for
    model servers that do not parse tool calls themselves), in OpenAI shape; malformed ones are passed on
    as they are, so the environment tells the model what was wrong."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            obj = json.loads(body)
            name, args = str(obj["name"]), obj.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            name, args = "invalid_tool_call", body.strip()
        arguments = args if isinstance(args, str) else json.dumps(args)
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return TOOL_CALL.sub("", text).strip(), calls


class Model:
    """Chat completions with tools; falls back to parsing tool calls from the text when the server has
    no tool-call parser (vLLM without --enable-auto-tool-choice answers 400 to tool_choice=auto)."""

    def __init__(self, base_url: str, api_key: str, model: str, temperature: float) -> None:
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=120, max_retries=2)
        self.model, self.temperature = model, temperature
        self.parse_text = False

    def turn(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
        }
        if self.parse_text:
            kwargs["tool_choice"] = "none"
        try:
            response = self.client.chat.completions.create(**kwargs)
        except openai.BadRequestError as e:
            if self.parse_text or "tool" not in str(e).lower():
                raise
            self.parse_text = True
            return self.turn(messages, tools, max_tokens)
        message = response.choices[0].message
        content = message.content or ""
        calls = [c.model_dump(include={"id", "type", "function"}) for c in message.tool_calls or []]
        if not calls:
            content, calls = parse_hermes_tool_calls(content)
        return {"role": "assistant", "content": content, "tool_calls": calls or None}


def play(env_server: httpx.Client, model: Model, env: dict[str, Any], task_id: str) -> dict[str, Any]:
    """One episode through the session API; returns its summary."""
    r = env_server.post(
        "/v1/sessions",
        json={"env": env["name"], "task_id": task_id},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    r.raise_for_status()
    session = r.json()
    sid, messages = session["session_id"], list(session["messages"])
    result: dict[str, Any] = {"done": False}
    try:
        for _ in range(session["max_turns"]):
            assistant = model.turn(messages, session["tools"], env["max_tokens_per_turn"])
            messages.append({k: v for k, v in assistant.items() if v is not None})
            r = env_server.post(
                f"/v1/sessions/{sid}/step", json=assistant, headers={"Idempotency-Key": uuid.uuid4().hex}
            )
            r.raise_for_status()
            result = r.json()
            messages.extend(result["messages"])
            if result["done"]:
                break
        if not result["done"]:  # cannot happen with max_turns respected, but ends the episode anyway
            result = env_server.post(f"/v1/sessions/{sid}/reward", json={"stop_reason": "max_turns"}).json()
    finally:
        env_server.delete(f"/v1/sessions/{sid}")
    return {
        "task_id": task_id,
        "reward": result["reward"],
        "stop_reason": result["stop_reason"],
        "turns": sum(m["role"] == "assistant" for m in messages),
    }


def rollout(
    env_server: httpx.Client, args: argparse.Namespace, env: dict[str, Any], task_id: str
) -> dict[str, Any]:
    """One episode run by the environment server itself (``POST /v1/rollouts``)."""
    body = {
        "env": env["name"],
        "task_id": task_id,
        "base_url": re.sub(r"/v1/?$", "", args.base_url),
        "model": args.model,
        "sampling": {"temperature": args.temperature},
    }
    r = env_server.post("/v1/rollouts", json=body, timeout=env["wall_time_limit_s"] + 60)
    r.raise_for_status()
    t = r.json()["trajectory"]
    return {
        "task_id": task_id,
        "reward": t["reward"],
        "stop_reason": t["stop_reason"],
        "turns": t["num_turns"],
        "prompt_tokens": len(t["prompt_ids"]),
        "completion_tokens": len(t["completion_ids"]),
        "error": (t["error"] or "").splitlines()[0] if t["error"] else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env-url", required=True, help="environment server, e.g. http://127.0.0.1:8765")
    p.add_argument("--token", default=os.environ.get("AGENTRL_ENV_TOKEN"), help="its bearer token")
    p.add_argument("--env", default="calc", help="environment name on the server")
    p.add_argument(
        "--base-url", required=True, help="OpenAI-compatible model server, e.g. http://127.0.0.1:8000/v1"
    )
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "EMPTY"))
    p.add_argument("--model", required=True, help="model name on that server")
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--split", default="test")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument(
        "--server-side", action="store_true", help="let the env server run each episode (rollouts)"
    )
    args = p.parse_args(argv)

    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    t0 = time.monotonic()
    with httpx.Client(
        base_url=args.env_url, headers=headers, timeout=httpx.Timeout(120, connect=10)
    ) as env_server:
        envs = {e["name"]: e for e in env_server.get("/v1/envs").raise_for_status().json()["envs"]}
        if args.env not in envs:
            print(f"error: the server serves {sorted(envs)}, not {args.env!r}", file=sys.stderr)
            return 2
        env = envs[args.env]
        page = env_server.get(
            f"/v1/envs/{args.env}/tasks", params={"split": args.split, "limit": args.episodes}
        )
        tasks = page.raise_for_status().json()["tasks"]
        model = Model(args.base_url, args.api_key, args.model, args.temperature)
        results = []
        for task in tasks:
            one = (
                rollout(env_server, args, env, task["id"])
                if args.server_side
                else play(env_server, model, env, task["id"])
            )
            results.append(one)
            print(json.dumps(one), flush=True)
    rewards = [r["reward"] for r in results]
    summary = {
        "episodes": len(results),
        "mean_reward": sum(rewards) / max(1, len(rewards)),
        "stop_reasons": sorted({r["stop_reason"] for r in results}),
        "wall_s": round(time.monotonic() - t0, 2),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
