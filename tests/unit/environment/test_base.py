"""The Environment API: tool schemas from hints and docstrings, argument validation, tool errors."""

from __future__ import annotations

from typing import Literal

import pytest

import agentrl
from agentrl.environment.base import ToolArgumentError
from agentrl.environment.schema import parse_docstring


class Shop(agentrl.Environment):
    name = "shop"

    @agentrl.tool
    def buy(self, item: str, qty: int = 1, express: bool = False) -> str:
        """Buy an item.

        Args:
            item: what to buy.
            qty: how many
                (at least one).
            express: ship fast.
        """
        return f"bought {qty} {item}"

    @agentrl.tool(name="price_of")
    async def price(self, item: Literal["apple", "pear"], tags: list[str] | None = None) -> dict:
        """Look up a price.

        :param item: the product.
        """
        if item == "pear":
            raise agentrl.ToolError("pears are sold out")
        return {"item": item, "price": 3}

    @agentrl.tool
    def submit(self, answer: float) -> str:
        """Submit the final answer."""
        self.finish()
        return "ok"

    @agentrl.tool
    def crash(self) -> str:
        """Always fails."""
        raise RuntimeError("boom")


def test_schema_from_hints_and_docstring() -> None:
    schemas = {s["function"]["name"]: s["function"] for s in Shop.tool_schemas()}
    assert set(schemas) == {"buy", "price_of", "submit", "crash"}
    buy = schemas["buy"]
    assert buy["description"] == "Buy an item."
    props = buy["parameters"]["properties"]
    assert props["item"] == {"type": "string", "description": "what to buy."}
    assert props["qty"] == {"type": "integer", "description": "how many (at least one).", "default": 1}
    assert props["express"]["type"] == "boolean"
    assert buy["parameters"]["required"] == ["item"]
    price = schemas["price_of"]["parameters"]["properties"]
    assert price["item"] == {"enum": ["apple", "pear"], "type": "string", "description": "the product."}
    assert price["tags"] == {"type": "array", "items": {"type": "string"}}


def test_parse_docstring_google_and_rest() -> None:
    desc, args = parse_docstring("Do it.\n\nArgs:\n    a: first\n    b (int): second\nReturns:\n    x")
    assert desc == "Do it."
    assert args == {"a": "first", "b": "second"}
    desc, args = parse_docstring("Other.\n:param x: the x\n:returns: y")
    assert (desc, args) == ("Other.", {"x": "the x"})


async def test_call_tool_ok_and_coercion() -> None:
    env = Shop()
    assert await env.call_tool("buy", {"item": "apple", "qty": 2.0}) == "bought 2 apple"
    assert await env.call_tool("price_of", {"item": "apple"}) == '{"item": "apple", "price": 3}'


@pytest.mark.parametrize(
    ("name", "args", "match"),
    [
        ("nope", {}, "unknown tool 'nope'"),
        ("buy", {}, "missing required argument"),
        ("buy", {"item": 3}, "must be of type string"),
        ("buy", {"item": "a", "qty": "2"}, "must be of type integer"),
        ("buy", {"item": "a", "color": "red"}, "unknown argument"),
        ("buy", ["a"], "must be a JSON object"),
        ("price_of", {"item": "banana"}, "must be one of"),
    ],
)
async def test_call_tool_bad_arguments(name: str, args: object, match: str) -> None:
    with pytest.raises(ToolArgumentError, match=match):
        await Shop().call_tool(name, args)


async def test_tool_error_and_finish() -> None:
    env = Shop()
    with pytest.raises(agentrl.ToolError, match="sold out"):
        await env.call_tool("price_of", {"item": "pear"})
    assert not env.finished
    await env.call_tool("submit", {"answer": 4})
    assert env.finished


async def test_default_reset_and_missing_reward() -> None:
    env = Shop()
    assert await env.reset({"id": "1", "prompt": "hi"}) == "hi"
    assert await env.reset({"id": "1", "messages": [{"role": "user", "content": "m"}]}) == [
        {"role": "user", "content": "m"}
    ]
    with pytest.raises(KeyError, match="neither 'prompt' nor 'messages'"):
        await env.reset({"id": "x"})
    with pytest.raises(NotImplementedError):
        await env.reward([])
    with pytest.raises(NotImplementedError, match="JSONL"):
        Shop.tasks()


async def test_custom_env_example_plays_an_episode() -> None:
    from examples.custom_env import Lookup

    env = Lookup()
    env.task = Lookup.tasks("test")[0]
    assert await env.reset(env.task) == "What is the capital of Peru?"
    assert [s["function"]["name"] for s in Lookup.tool_schemas()] == ["capital_of", "submit"]
    with pytest.raises(agentrl.ToolError, match="no data"):
        await env.call_tool("capital_of", {"country": "Atlantis"})
    city = await env.call_tool("capital_of", {"country": "Peru"})
    await env.call_tool("submit", {"answer": city})
    assert env.finished and await env.reward([]) == 1.0
