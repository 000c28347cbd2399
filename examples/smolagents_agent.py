"""A calculator agent written plainly with smolagents: it knows nothing of agentrl.

It reads its task as JSON (from $AGENTRL_TASK, else stdin): ``{"messages": [...]}`` (the opening
conversation) or ``{"question": "..."}``, and runs smolagents' own ``ToolCallingAgent`` with a calculator
tool on smolagents' ``OpenAIModel``, which reaches whatever OpenAI-compatible server $OPENAI_BASE_URL /
$OPENAI_API_KEY name (the ``openai`` SDK reads them). The opening's system prompt becomes the agent's
``instructions``, its user message the task; the agent answers by calling its ``final_answer`` tool.

    agentrl train --env calc --agent "python examples/smolagents_agent.py"

trains the model behind it (docs/blackbox.md).
"""

from __future__ import annotations

import json
import os
import sys

from blackbox_agent import calculate as evaluate  # the calculator of blackbox_agent.py, next to this file
from smolagents import OpenAIModel, ToolCallingAgent, tool
from smolagents.monitoring import LogLevel

calculate = tool(evaluate)  # its name, docstring and type hints describe the tool to the model


def main() -> int:
    task = json.loads(os.environ.get("AGENTRL_TASK") or sys.stdin.read())
    messages = task.get("messages") or [{"role": "user", "content": task["question"]}]
    instructions = "\n".join(m["content"] for m in messages if m["role"] == "system") or None
    question = "\n".join(m["content"] for m in messages if m["role"] == "user")
    model = OpenAIModel(model_id="policy", max_tokens=64, client_kwargs={"timeout": 300, "max_retries": 2})
    agent = ToolCallingAgent(tools=[calculate], model=model, instructions=instructions, max_steps=5,
                             verbosity_level=LogLevel.OFF)
    # a wrong tool call or a model that never calls final_answer is not a crash: smolagents tells the model
    # its error, and after max_steps asks it once more for an answer without tools
    print(agent.run(question))
    return 0


if __name__ == "__main__":
    sys.exit(main())
