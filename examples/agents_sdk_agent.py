"""A calculator agent written plainly with the OpenAI Agents SDK (``openai-agents``): it knows nothing of agentrl.

It reads its task as JSON (from $AGENTRL_TASK, else stdin): ``{"messages": [...]}`` (the opening
conversation) or ``{"question": "..."}``, and runs one ``Agent`` with a calculator tool against whatever
OpenAI-compatible server $OPENAI_BASE_URL / $OPENAI_API_KEY name. By default the SDK speaks the Responses
API; ``--api chat_completions`` makes it use Chat Completions.

    agentrl train --env calc --agent "python examples/agents_sdk_agent.py"

trains the model behind it (docs/blackbox.md). Tracing is off: the key is the policy server's, not OpenAI's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_api, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from blackbox_agent import calculate as evaluate  # the calculator of blackbox_agent.py, next to this file

calculate = function_tool(evaluate)  # its name, docstring and type hints describe the tool to the model


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=["responses", "chat_completions"], default="responses")
    args = parser.parse_args()
    set_tracing_disabled(True)
    set_default_openai_api(args.api)
    task = json.loads(os.environ.get("AGENTRL_TASK") or sys.stdin.read())
    messages = task.get("messages") or [{"role": "user", "content": task["question"]}]
    instructions = "\n".join(m["content"] for m in messages if m["role"] == "system") or None
    conversation = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]
    agent = Agent(name="calculator", instructions=instructions, tools=[calculate], model="policy",
                  model_settings=ModelSettings(max_tokens=64))
    try:
        result = await Runner.run(agent, conversation, max_turns=5)
    except (MaxTurnsExceeded, ModelBehaviorError) as e:
        # the model kept calling tools, or called one that does not exist: the episode ends unanswered (an
        # outcome to score, not a crash of the agent)
        print(f"no answer: {type(e).__name__}: {e}")
        return 0
    print(result.final_output)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
