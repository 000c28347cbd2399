"""A plain tool-calling agent written with only the `openai` SDK: it knows nothing of agentrl.

It reads its task as JSON (from $AGENTRL_TASK, else stdin): ``{"messages": [...]}`` (the opening
conversation) or ``{"question": "..."}``; it talks to whatever OpenAI-compatible server
$OPENAI_BASE_URL / $OPENAI_API_KEY name, runs its own calculator tool, and prints its final answer.
`agentrl train --agent "python examples/blackbox_agent.py"` trains the model behind it (docs/blackbox.md).
"""

from __future__ import annotations

import ast
import json
import operator
import os
import sys

from openai import OpenAI

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression and return the result.",
        "parameters": {"type": "object", "properties": {"expression": {
            "type": "string", "description": 'numbers with + - * / and parentheses, e.g. "23 + 3 * 12".'}},
            "required": ["expression"]},
    },
}]
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: numbers with + - * / and parentheses, e.g. "23 + 3 * 12".
    """
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.operand))
        raise ValueError("only numbers, + - * / and parentheses")

    try:
        value = ev(ast.parse(expression[:200], mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as e:
        return f"error: {e}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def main() -> int:
    task = json.loads(os.environ.get("AGENTRL_TASK") or sys.stdin.read())
    messages = task.get("messages") or [{"role": "user", "content": task["question"]}]
    client = OpenAI(timeout=300, max_retries=2)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    for _ in range(4):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=64)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            print(message.content)
            return 0
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(expression))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
