"""A calculator agent written plainly with LangChain (``langchain-openai``): it knows nothing of agentrl.

It reads its task as JSON (from $AGENTRL_TASK, else stdin): ``{"messages": [...]}`` (the opening
conversation) or ``{"question": "..."}``, binds a calculator tool to ``ChatOpenAI`` (which reaches whatever
OpenAI-compatible server $OPENAI_BASE_URL / $OPENAI_API_KEY name) and runs LangChain's tool-calling loop:
call the model, run the tools it asks for, hand back their results, until it answers.

    agentrl train --env calc --agent "python examples/langchain_agent.py"

trains the model behind it (docs/blackbox.md).
"""

from __future__ import annotations

import json
import os
import sys

from blackbox_agent import calculate as evaluate  # the calculator of blackbox_agent.py, next to this file
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import ValidationError

calculate = tool(evaluate)  # its name, docstring and type hints describe the tool to the model


def main() -> int:
    task = json.loads(os.environ.get("AGENTRL_TASK") or sys.stdin.read())
    opening = task.get("messages") or [{"role": "user", "content": task["question"]}]
    kinds = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
    messages: list[BaseMessage] = [kinds[m["role"]](m["content"]) for m in opening]
    llm = ChatOpenAI(model="policy", max_tokens=64, timeout=300, max_retries=2).bind_tools([calculate])
    for _ in range(5):
        reply = llm.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            print(reply.content)
            return 0
        for call in reply.tool_calls:
            try:
                result = calculate.invoke(call["args"])
            except ValidationError as e:  # arguments that are not {"expression": "..."}: the model is told
                result = f"error: {e.errors()[0]['msg']}"
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
