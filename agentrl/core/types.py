"""The trajectory data contract shared by the agent loop, the buffer, the trainer and the env server.

A `Trajectory` holds one episode exactly as the engine saw it:

- ``prompt_ids``: the opening prompt's token ids (system, tools, first user turn, generation prompt);
- ``completion_ids``: every token after the prompt, in order: model tokens *and* the tool-observation
  tokens appended between turns. Turn k+1's prompt is always ``prompt_ids + completion_ids[:n]``;
- ``loss_mask``: 1 on model-generated tokens, 0 on tool/template tokens (one entry per completion token);
- ``logprobs``: the behaviour policy's logprob of each completion token (0.0 where the mask is 0);
- ``versions``: the policy version that generated each completion token (-1 where the mask is 0);
- ``temperature``: the sampling temperature, so the trainer scores the distribution that was sampled.

Text is never re-tokenized to rebuild a sequence: the ids above are the ids the engine returned.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrl.core.errors import AgentRLError
from agentrl.core.masks import SamplingMask


class StopReason(str, enum.Enum):
    """Why an episode ended."""

    COMPLETED = "completed"
    """The model answered without a tool call, or a tool ended the episode (e.g. ``submit``)."""
    MAX_TURNS = "max_turns"
    """The environment's ``max_turns`` was reached."""
    MAX_TOKENS = "max_tokens"
    """A generation was cut by its token budget or the context window."""
    TIMEOUT = "timeout"
    """The agent's time budget (``Environment.agent_time_limit_s``: its tool calls) ran out. Trained on:
    the agent spent that time."""
    WALL_TIMEOUT = "wall_timeout"
    """The hard wall-clock safety limit (``Environment.wall_time_limit_s``) ran out: the engine or the
    environment was too slow. An infrastructure failure, never trained on."""
    PARSE_ERROR = "parse_error"
    """Too many consecutive malformed tool calls."""
    ENV_ERROR = "env_error"
    """The environment raised in ``reset``, a tool, or ``reward``."""
    INFERENCE_ERROR = "inference_error"
    """The inference endpoint failed (dead server, repeated HTTP errors)."""
    ABORTED = "aborted"
    """The run was shut down while the episode was in flight."""


FAILED_STOP_REASONS = frozenset(
    {StopReason.ENV_ERROR, StopReason.INFERENCE_ERROR, StopReason.ABORTED, StopReason.WALL_TIMEOUT})
"""Stop reasons of episodes that broke (not the model's doing): recorded, never trained on by default."""
SCORED_STOP_REASONS = frozenset(
    {StopReason.COMPLETED, StopReason.MAX_TURNS, StopReason.MAX_TOKENS, StopReason.PARSE_ERROR})
"""Stop reasons whose episodes are scored by ``reward()``; the others get reward 0."""


class RoutingShapeError(AgentRLError, ValueError):
    """MoE routing rows do not fit: their shape or dtype is not the record's, their versions do not match
    them, or they cover more positions than the sequence they belong to."""

    code = "trajectory.routing"


class TokenDataError(AgentRLError, ValueError):
    """The per-token data of a trajectory, a training sample or a sampled call is inconsistent: lengths that
    disagree, an empty sequence, a trained first token, or a temperature that is not positive."""

    code = "trajectory.tokens"


class ToolCall(BaseModel):
    """One tool call as parsed from the model's output."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Message(BaseModel):
    """A chat message, OpenAI-style, kept for humans and logs (never for rebuilding token ids)."""

    role: str
    content: str = ""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI chat dict (tool call arguments as JSON strings)."""
        import json

        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def message_field(message: Message | dict[str, Any], key: str) -> Any:
    """``key`` of a message given as a :class:`Message` or as its OpenAI dict (None when it has none)."""
    return message.get(key) if isinstance(message, dict) else getattr(message, key, None)


def tool_call_names(message: Message | dict[str, Any]) -> list[str]:
    """The names of the tools a message calls, whether a :class:`Message` or an OpenAI dict (whose calls name
    their tool at the top or under ``function``)."""
    names = []
    for call in message_field(message, "tool_calls") or []:
        if isinstance(call, dict):
            names.append(call.get("name") or (call.get("function") or {}).get("name"))
        else:
            names.append(getattr(call, "name", None))
    return [n for n in names if n]


class Timings(BaseModel):
    """Wall-clock seconds spent in each part of an episode."""

    generate_s: float = 0.0
    """Waiting for the engine (queueing and paused updates included): never charged to the agent."""
    tool_s: float = 0.0
    """In tool calls: what the agent's time limit counts."""
    reset_s: float = 0.0
    """In the environment's ``reset``."""
    reward_s: float = 0.0
    """In the environment's ``reward``."""
    total_s: float = 0.0
    """The whole episode."""


class Routing(BaseModel):
    """MoE expert routing of an episode, as the engine computed it: for positions ``0 .. n-1`` of
    ``prompt_ids + completion_ids``, the top-k expert ids of every layer (rows of layers that are not MoE
    are zeros). Layout: row-major ``[n, layers, top_k]`` of ``dtype`` (vLLM's own ``routed_experts``
    layout). ``n`` is at most the sequence length minus one: the last token was never fed forward.

    Routing recorded before a weight update stays as the old weights computed it (a request recomputed
    after an update keeps its first routing); ``versions`` says which policy version computed which span.
    """

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    layers: int = Field(ge=1)
    """The model's decoder layers (all of them, MoE or not)."""
    top_k: int = Field(ge=1)
    """Experts per token."""
    dtype: Literal["uint8", "uint16"] = "uint8"
    """``uint8`` (up to 256 experts) or ``uint16``."""
    ids: bytes = b""
    """The routing rows, row-major ``[n, layers, top_k]`` (base64 in JSON)."""
    versions: list[tuple[int, int]] = Field(default_factory=list)
    """``(first position, policy version)`` spans, in order: the version whose forward pass computed the
    routing of the positions from there to the next span."""

    @property
    def row_bytes(self) -> int:
        """Bytes of one position's routing."""
        return self.layers * self.top_k * (1 if self.dtype == "uint8" else 2)

    @property
    def n(self) -> int:
        """Positions covered."""
        return len(self.ids) // self.row_bytes

    def array(self) -> Any:
        """The rows as a numpy array ``[n, layers, top_k]`` (read-only view)."""
        import numpy as np

        return np.frombuffer(self.ids, dtype=self.dtype).reshape(self.n, self.layers, self.top_k)

    def extend(self, rows: Any, versions: list[int]) -> None:
        """Append positions ``n ..`` (``rows``: ``[m, layers, top_k]``), computed by ``versions[i]`` each."""
        if tuple(rows.shape[1:]) != (self.layers, self.top_k) or str(rows.dtype) != self.dtype:
            raise RoutingShapeError(f"routing rows of shape {tuple(rows.shape)} {rows.dtype} do not extend "
                                    f"[n, {self.layers}, {self.top_k}] {self.dtype}")
        if len(versions) != len(rows):
            raise RoutingShapeError(f"{len(rows)} routing rows but {len(versions)} versions")
        start = self.n
        for i, v in enumerate(versions):
            if not self.versions or self.versions[-1][1] != v:
                self.versions.append((start + i, v))
        self.ids += rows.tobytes()

    def truncate(self, n: int) -> None:
        """Keep positions ``0 .. n-1`` only (a sequence cut short after its routing was recorded)."""
        if n < self.n:
            self.ids = self.ids[: n * self.row_bytes]
            self.versions = [span for span in self.versions if span[0] < n]

    def check(self, seq_len: int) -> None:
        """Raise :class:`RoutingShapeError` (a ``ValueError``) if the routing does not fit a sequence of
        ``seq_len`` tokens."""
        if len(self.ids) % self.row_bytes:
            raise RoutingShapeError(f"routing holds {len(self.ids)} bytes, not a whole number of {self.row_bytes}-byte rows")
        if self.n > max(0, seq_len - 1):
            raise RoutingShapeError(f"routing covers {self.n} positions but the sequence has {seq_len} tokens "
                                    "(at most one position fewer: the last token is never fed forward)")


class Trajectory(BaseModel):
    """One episode: token data for training plus structured turns for humans."""

    task_id: str
    env: str
    group_id: str = ""
    """Rollouts of the same task in the same step share a group id (GRPO groups)."""
    episode_id: str = ""
    """Rows of one episode share it (a black-box agent that rewrites its history makes several rows); group
    advantages are computed per episode. Empty: the trajectory is its own episode."""
    prompt_ids: list[int] = Field(default_factory=list)
    completion_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    versions: list[int] = Field(default_factory=list)
    temperature: float = 1.0
    """Sampling temperature of every model token (the engine's logprobs are at this temperature)."""
    messages: list[Message] = Field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)
    """Extra per-episode scalars (partial credit, reward components); never used as the reward."""
    stop_reason: StopReason = StopReason.COMPLETED
    error: str | None = None
    """For failed episodes: ``ErrorType: message``."""
    num_turns: int = 0
    num_tool_calls: int = 0
    num_malformed_tool_calls: int = 0
    timings: Timings = Field(default_factory=Timings)
    routing: Routing | None = None
    """MoE expert routing of the episode's positions (:class:`Routing`), for replay in the trainer; None
    for dense models or when capture is off."""
    sampling_mask: SamplingMask | None = None
    """The tokens the engine's truncated distribution (top-k, top-p, min-p) kept at each completion token
    (:class:`~agentrl.core.masks.SamplingMask`); None when sampling cut nothing."""

    @property
    def failed(self) -> bool:
        """True if the episode ended because something broke (not because the model did badly)."""
        return self.stop_reason in FAILED_STOP_REASONS

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    def check(self) -> None:
        """Raise :class:`TokenDataError` (a ``ValueError``) if the per-token fields disagree in length (or
        :class:`RoutingShapeError` if the routing does not fit)."""
        n = len(self.completion_ids)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise TokenDataError(f"trajectory {self.task_id}: len({name})={len(getattr(self, name))} != {n}")
        if self.routing is not None:
            self.routing.check(len(self.prompt_ids) + n)
        if self.sampling_mask is not None:
            self.sampling_mask.check(n)


@dataclass
class TrainSample:
    """One training sequence: the prompt and completion ids, aligned per position.

    ``behav_logprobs[t]`` is the behaviour policy's ``log p(input_ids[t] | input_ids[:t])`` (0 where the
    mask is 0), the same convention as :func:`agentrl.trainer.loss.token_logprobs`.
    """

    input_ids: list[int]
    """Token ids of the whole sequence (prompt + completion)."""
    loss_mask: list[int]
    """1 on model-generated tokens (trained on), 0 on prompt, tool and template tokens."""
    behav_logprobs: list[float]
    """Logprob of each token under the policy that sampled it; 0.0 where the mask is 0."""
    advantage: float
    """The sequence's advantage (e.g. GRPO group-normalised reward)."""
    versions: list[int]
    """Policy version that generated each token; -1 where the mask is 0."""
    temperature: float = 1.0
    """Sampling temperature of the masked tokens: logprobs are of ``softmax(logits / temperature)``."""
    routing: Routing | None = None
    """MoE expert routing of positions ``0 .. routing.n - 1`` as the engine computed them (replayed in the
    trainer's forward pass); None: the model routes by itself."""
    sampling_mask: SamplingMask | None = None
    """The engine's kept token set at each position of ``input_ids`` (count 0 where nothing was cut): the
    trainer renormalises its distribution over it; None: sampling cut nothing."""

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if n == 0:
            raise TokenDataError("TrainSample.input_ids is empty")
        if not self.temperature > 0:
            raise TokenDataError(f"TrainSample.temperature must be > 0 (got {self.temperature}): greedy "
                                 "generations have no sampling distribution to train")
        for name in ("loss_mask", "behav_logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise TokenDataError(f"TrainSample.{name} has {len(getattr(self, name))} entries, expected {n}")
        if self.loss_mask[0]:
            raise TokenDataError("TrainSample.loss_mask[0] must be 0: the first token has no context")
        if self.routing is not None:
            self.routing.check(n)
        if self.sampling_mask is not None:
            self.sampling_mask.check(n)

    @property
    def num_loss_tokens(self) -> int:
        """Number of positions with a loss mask of 1."""
        return sum(1 for m in self.loss_mask if m)
