"""A server agentrl did not start (``vllm serve DIR``) serves its model under its own name: the stack requests
that name where the server lists one model and not agentrl's."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from agentrl.launch.stack import endpoint_model


def _serving(monkeypatch: pytest.MonkeyPatch, models: list[dict[str, Any]] | None) -> None:
    def get(url: str, timeout: float) -> Any:
        assert url == "http://h:1/v1/models" and timeout == 5
        if models is None:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json={"object": "list", "data": models})

    monkeypatch.setattr(httpx, "get", get)


@pytest.mark.parametrize(("models", "name"), [
    ([{"id": "exports/calc"}], "exports/calc"),  # vllm serve exports/calc
    ([{"id": "base"}, {"id": "policy", "parent": "base"}], "base"),  # agentrl's own server, an adapter loaded
    ([{"id": "a"}, {"id": "b"}], "base"),  # several: no guess
    ([], "base"),
    (None, "base"),  # unreachable: the health check reports it
])
def test_the_base_is_requested_by_the_name_the_server_gives_it(
        monkeypatch: pytest.MonkeyPatch, models: list[dict[str, Any]] | None, name: str) -> None:
    _serving(monkeypatch, models)
    assert endpoint_model("http://h:1", "base", 5) == name
