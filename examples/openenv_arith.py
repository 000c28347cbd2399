"""A small environment written with ``openenv-core`` itself (its own server class and app), for training
with agentrl through the OpenEnv protocol.

Each episode asks for ``a * b + c`` (numbers drawn from the reset seed). The MCP tools are ``add``,
``multiply`` and ``answer``; ``answer`` ends the episode with reward 1 when the value is right, else 0.

Serve it with ``python examples/openenv_arith.py --port 8001`` (it prints ``serving on <url>``), then
train on it with ``agentrl train --env openenv:http://127.0.0.1:8001`` (``agentrl eval`` takes the same
``--env``). Its tools, observations and rewards reach agentrl through OpenEnv's WebSocket and MCP routes;
no agentrl code runs in this server.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State


class ArithObservation(Observation):
    """The reset observation: the question."""

    prompt: str = ""


class ArithEnv(MCPEnvironment):
    """Compute a * b + c with tools, then call answer."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("arith")
        self._target: int | None = None
        self._given: int | None = None
        self._state = State(episode_id=None, step_count=0)

        @mcp.tool()
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool()
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            return a * b

        @mcp.tool()
        def answer(value: int) -> str:
            """Give the final answer (ends the episode)."""
            self._given = value
            return f"answer {value} recorded"

        super().__init__(mcp)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> ArithObservation:
        rng = random.Random(seed)
        a, b, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(1, 40)
        self._target, self._given = a * b + c, None
        self._state = State(episode_id=episode_id, step_count=0)
        return ArithObservation(prompt=f"What is {a} * {b} + {c}? Use the tools, then call answer with the "
                                       "result.", done=False, reward=None)

    def _score(self, action: Action, obs: Observation) -> Observation:
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and action.tool_name == "answer" and obs.error is None:
            obs.done = True
            obs.reward = 1.0 if self._given == self._target else 0.0
        return obs

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._score(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._score(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": "only MCP tool calls are supported"})

    @property
    def state(self) -> State:
        return self._state


app = create_app(ArithEnv, CallToolAction, CallToolObservation, env_name="arith", max_concurrent_envs=64)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    print(f"serving on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
