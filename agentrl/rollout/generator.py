"""What the agent loop needs from an inference client: token-id prompts in, a `Generation` out (a typing
protocol; :class:`agentrl.inference.InferenceClient` is the real one, unit tests pass small fakes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from agentrl.inference.wire import Generation


class Generator(Protocol):
    """Samples completions of token-id prompts (the agent loop's view of an inference client)."""

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_token_ids: list[int] | None = None,
        model: str | None = None,
        key: str | None = None,
        seed: int | None = None,
        cache_salt: str | None = None,
        top_logprobs: int = 0,
        min_p: float = 0.0,
        sampling_mask: bool = False,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> Generation: ...
