"""The wire protocol of the environment server: request and response bodies, one docstring per field.

Messages and tool calls use the OpenAI chat shape, so an agent written against the OpenAI SDK can pass
its assistant message to ``step`` and append the returned tool messages to its conversation as they are.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentrl.core.errors import AgentRLError
from agentrl.core.types import Message, StopReason, ToolCall, Trajectory

MAX_ID = 256
"""Longest id (session, task, tool call, environment name) accepted."""


class RequestFieldsError(AgentRLError, ValueError):
    """A request gives a combination of fields that cannot go together, or leaves out one of a required pair
    (raised in a validator: pydantic reports it, and the server answers 422)."""

    code = "server.request_fields"


class Wire(BaseModel):
    """Base of the protocol's models: each field's docstring is its description in the OpenAPI spec."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class ErrorBody(Wire):
    """Every error answer (4xx; a 5xx only for a server bug) has this shape; never a stack trace."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "error": "not_found",
                    "message": "unknown session 'abc' (closed, expired, or the server restarted)",
                    "detail": None,
                }
            ]
        }
    )

    error: str
    """Machine-readable code: ``invalid_request``, ``unauthorized``, ``not_found``, ``conflict``,
    ``payload_too_large``, ``too_many_requests``, ``env_error``, ..."""
    message: str
    """What went wrong, for a human."""
    detail: list[dict[str, Any]] | None = None
    """For ``invalid_request``: one entry per problem, with its location in the request (``loc``) and ``msg``."""


class FunctionCall(Wire):
    """The function part of an OpenAI tool call."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(..., min_length=1, max_length=MAX_ID, examples=["calculate"])
    """Tool name."""
    arguments: str | dict[str, Any] = Field("{}", examples=['{"expression": "23 + 3 * 12"}'])
    """Arguments: a JSON object, or a string holding one (as the OpenAI API returns them)."""


class ToolCallIn(Wire):
    """One tool call of an assistant turn (OpenAI shape)."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = Field(None, max_length=MAX_ID, examples=["call_1"])
    """Call id, echoed as the observation's ``tool_call_id`` (one is generated when missing)."""
    type: Literal["function"] = "function"
    """Always ``function``."""
    function: FunctionCall
    """Which tool, with which arguments."""


class ChatMessage(Wire):
    """A chat message (OpenAI shape)."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {"role": "user", "content": "Tom has 23 apples and buys 3 bags of 12. How many now?"}
            ]
        },
    )

    role: Literal["system", "user", "assistant", "tool"]
    """Who speaks."""
    content: str | None = None
    """Text of the message."""
    tool_calls: list[ToolCallIn] | None = None
    """Tool calls of an assistant message."""
    tool_call_id: str | None = Field(None, max_length=MAX_ID)
    """For a tool message: the call it answers."""
    name: str | None = Field(None, max_length=MAX_ID)
    """For a tool message: the tool's name."""

    def to_message(self) -> Message:
        """This message as an agentrl ``Message`` (tool-call arguments parsed; unparsable ones become {})."""
        calls = None
        if self.tool_calls:
            calls = [
                ToolCall(
                    id=c.id or f"call_{i}",
                    name=c.function.name,
                    arguments=parse_arguments(c.function.arguments)[0] or {},
                )
                for i, c in enumerate(self.tool_calls)
            ]
        return Message(
            role=self.role,
            content=self.content or "",
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            name=self.name,
        )


def parse_arguments(arguments: str | dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(arguments as an object, None) or (None, an error message meant for the model)."""
    if isinstance(arguments, dict):
        return arguments, None
    if not arguments.strip():
        return {}, None
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError) as e:
        return None, f"arguments are not valid JSON ({getattr(e, 'msg', e)}): {arguments[:200]}"
    if not isinstance(value, dict):
        return None, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


# ----- environments ---------------------------------------------------------------------------------
class EnvInfo(Wire):
    """An environment the server serves, with its tools."""

    name: str
    """Name to use in ``POST /v1/sessions``."""
    description: str
    """First paragraph of the environment class's docstring."""
    tools: list[dict[str, Any]]
    """OpenAI ``tools`` list (function schemas) to pass to the model."""
    system_prompt: str | None
    """System message placed before the opening prompt (already included in a session's messages)."""
    max_turns: int
    """Model turns per episode; the step that reaches it ends the episode (``stop_reason: max_turns``)."""
    max_tokens_per_turn: int
    """The environment's token budget for one model turn (a hint for the client's sampler)."""
    tool_timeout_s: float
    """Wall-clock limit of one tool call."""
    agent_time_limit_s: float
    """Seconds the agent's tool calls may take in total in one episode (the server enforces it; running
    out ends the episode with ``stop_reason: timeout``). Time spent between steps is not counted."""
    wall_time_limit_s: float
    """The environment's hard wall-clock limit for one whole episode, for clients that run episodes
    (``POST /v1/rollouts`` enforces it: ``stop_reason: wall_timeout``)."""
    accepts_task_payload: bool
    """Whether sessions may be created on a task object (else only on ``task_id``)."""


class EnvList(Wire):
    """``GET /v1/envs``."""

    envs: list[EnvInfo]
    """Every environment served."""


class TaskList(Wire):
    """``GET /v1/envs/{env}/tasks``: one page of an environment's dataset."""

    env: str
    """Environment name."""
    split: str
    """Dataset split."""
    total: int
    """Tasks in the split."""
    offset: int
    """Index of the first task of this page."""
    tasks: list[dict[str, Any]]
    """The tasks (JSON objects, each with an ``id``)."""


# ----- sessions -------------------------------------------------------------------------------------
class CreateSession(Wire):
    """``POST /v1/sessions``: start an episode on a task of the dataset (``task_id``) or on a task object."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"env": "calc", "task_id": "train-0"},
                {"env": "calc", "task": {"id": "mine-1", "question": "What is 6 * 7?", "answer": 42}},
            ]
        },
    )

    env: str | None = Field(None, min_length=1, max_length=MAX_ID)
    """Environment name; may be left out when the server serves exactly one."""
    task_id: str | None = Field(None, min_length=1, max_length=MAX_ID)
    """Id of a task in the environment's dataset."""
    split: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """Split to look ``task_id`` up in (default: every split)."""
    task: dict[str, Any] | None = None
    """A task object (the environment's format, e.g. ``question``/``answer`` for calc); needs the server's
    ``allow_task_payload``. An ``id`` is added when missing."""

    @model_validator(mode="after")
    def _one_task(self) -> CreateSession:
        if (self.task_id is None) == (self.task is None):
            raise RequestFieldsError("give exactly one of task_id (a task of the dataset) or task (a task object)")
        if self.task is not None and self.split is not None:
            raise RequestFieldsError("split only applies to task_id")
        return self


class SessionCreated(Wire):
    """A new session: the opening messages to give the model, and its tools."""

    session_id: str
    """Id for the other session routes."""
    env: str
    """Environment name."""
    task_id: str
    """The task's id."""
    messages: list[dict[str, Any]]
    """Opening chat messages (system prompt and first user turn), OpenAI shape."""
    tools: list[dict[str, Any]]
    """OpenAI ``tools`` list to pass to the model."""
    max_turns: int
    """Model turns allowed (each step counts one unless it says ``count_turn: false``)."""
    idle_ttl_s: float
    """The session is closed after this many seconds without a request."""


class StepRequest(Wire):
    """``POST /v1/sessions/{id}/step``: the assistant's turn. Its tool calls are run in order; a turn
    without tool calls is the final answer and ends the episode. Unknown OpenAI message fields are ignored,
    so an SDK's assistant message can be sent as it is."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "calculate", "arguments": '{"expression": "23 + 3 * 12"}'},
                        }
                    ],
                },
                {"content": "The answer is 59."},
            ]
        },
    )

    role: Literal["assistant"] = "assistant"
    """Always ``assistant``."""
    content: str | None = None
    """Text of the turn (kept in the transcript the reward sees)."""
    tool_calls: list[ToolCallIn] | None = None
    """Tool calls to run, in order. None or empty: the final answer."""
    count_turn: bool = True
    """Whether this step is a new model turn for ``max_turns``. Clients that send one tool call per step
    and enforce the turn limit themselves send ``false``."""


class Observation(Wire):
    """The result of one tool call."""

    tool_call_id: str
    """The call it answers."""
    name: str
    """Tool name."""
    content: str
    """What the model should read (``Error: ...`` for failures)."""
    error: Literal["invalid_arguments", "tool_error", "timeout", "env_error"] | None = None
    """None if the tool succeeded. ``invalid_arguments``: unknown tool or arguments that do not fit its
    schema; ``tool_error``: the tool reported a problem; ``timeout``: the call ran out of time; ``env_error``:
    the environment itself failed (the episode ends with ``stop_reason: env_error``)."""
    tool_s: float | None = None
    """Seconds the tool itself ran: what the episode's agent time limit is charged (None: it did not run)."""


class StepResult(Wire):
    """What a step did and whether the episode is over."""

    observations: list[Observation]
    """One per tool call run (calls after one that ended the episode are not run)."""
    messages: list[dict[str, Any]]
    """The observations as OpenAI tool messages, ready to append to the conversation."""
    done: bool
    """Whether the episode is over (no more steps)."""
    stop_reason: StopReason | None = None
    """Why it ended: ``completed`` (final answer, or a tool ended it), ``max_turns``, ``env_error``."""
    reward: float | None = None
    """The reward, once the episode is over."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Extra scalars from the environment's reward (never the reward itself)."""
    turn: int
    """Model turns so far."""
    error: str | None = None
    """For ``env_error``: what failed (``ErrorType: message``)."""


class RewardRequest(Wire):
    """``POST /v1/sessions/{id}/reward``: end the episode (if not over) and score it."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{}, {"stop_reason": "max_tokens"}]}
    )

    messages: list[ChatMessage] | None = Field(None, max_length=10_000)
    """The conversation to score, if the client kept its own (e.g. its final answer was never sent as a
    step). Default: the server's transcript of the session."""
    stop_reason: StopReason | None = None
    """Why the client stopped, recorded if the episode was not over yet (default ``completed``)."""


class RewardResult(Wire):
    """The episode's score. It is computed once per session; later calls return the same."""

    reward: float
    """The reward."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Extra scalars from the environment's reward."""
    stop_reason: StopReason
    """Why the episode ended."""
    error: str | None = None
    """If the environment failed while scoring: ``ErrorType: message`` (the reward is then 0)."""


class SessionState(Wire):
    """``GET /v1/sessions/{id}``."""

    session_id: str
    """Session id."""
    env: str
    """Environment name."""
    task_id: str
    """The task's id."""
    turn: int
    """Model turns so far."""
    steps: int
    """Steps taken."""
    done: bool
    """Whether the episode is over."""
    stop_reason: StopReason | None
    """Why it ended, once over."""
    reward: float | None
    """The reward, once computed."""
    metrics: dict[str, float]
    """Extra reward scalars."""
    messages: list[dict[str, Any]]
    """The server's transcript (opening messages, steps and observations)."""
    age_s: float
    """Seconds since the session was created."""
    idle_s: float
    """Seconds since its last request."""


class Closed(Wire):
    """``DELETE /v1/sessions/{id}``."""

    session_id: str
    """The closed session."""
    closed: bool = True
    """Always true: its resources are released."""


# ----- whole rollouts ---------------------------------------------------------------------------------
class RolloutSampling(Wire):
    """Sampling for a server-side rollout."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0.0, le=10.0)
    """Sampling temperature."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    top_k: int = Field(0, ge=0, le=1_000_000)
    """Sample among the k most likely tokens; 0 disables."""
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    """Drop tokens less likely than ``min_p`` times the most likely one; 0 disables."""
    max_context_tokens: int = Field(2048, ge=16, le=1_048_576)
    """Prompt plus completion may not exceed this many tokens (the engine's max_model_len)."""


class RolloutRequest(Wire):
    """``POST /v1/rollouts``: run a whole episode here, sampling from the caller's inference server.

    The server must be vLLM-compatible in returning token ids: ``POST /inference/v1/generate`` (token in,
    token out) or ``POST /v1/completions`` with ``return_token_ids``; the chat template comes from one of
    the tokenizers this env server was started with (``--tokenizer``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"env": "calc", "task_id": "test-0", "base_url": "http://127.0.0.1:8000", "model": "base"}
            ]
        },
    )

    env: str | None = Field(None, min_length=1, max_length=MAX_ID)
    """Environment name; may be left out when the server serves exactly one."""
    task_id: str | None = Field(None, min_length=1, max_length=MAX_ID)
    """Id of a task in the environment's dataset."""
    split: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """Split to look ``task_id`` up in (default: every split)."""
    task: dict[str, Any] | None = None
    """A task object instead of ``task_id``."""
    base_url: str = Field(..., max_length=2048, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    """Base URL of the inference server (without ``/v1``), e.g. ``http://10.0.0.5:8000``."""
    model: str = Field(..., min_length=1, max_length=MAX_ID)
    """Served model (or LoRA adapter) name to sample from."""
    tokenizer: str | None = Field(None, min_length=1, max_length=1024)
    """Which of the server's tokenizers renders the chat (default: its first)."""
    tool_parser: str = Field("hermes", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """How the model writes tool calls: a vLLM tool parser name (as ``agentrl train --tool-parser``)."""
    api_key: str | None = Field(None, max_length=4096, repr=False)
    """Bearer token for the inference server, if it needs one."""
    return_routing: bool = False
    """MoE models: also record the experts the engine routed every position to (``trajectory.routing``,
    for routing replay in the caller's trainer). The inference server must capture routing: an agentrl-started
    vLLM (its worker extension) or a vLLM that returns ``routed_experts`` itself; otherwise the request is
    refused (422) rather than answered without routing."""
    return_sampling_mask: bool = False
    """Truncated sampling (``top_p < 1``, ``top_k > 0``, ``min_p > 0``): also record the set of tokens the
    engine's distribution kept at every sampled token (``trajectory.sampling_mask``), so the caller's trainer
    can score the distribution that was sampled. The inference server must capture them (an agentrl-started
    vLLM); otherwise the request is refused (422). Untruncated sampling records nothing."""
    sampling: RolloutSampling = Field(default_factory=RolloutSampling)
    """Sampling parameters."""
    group_id: str = Field("", max_length=MAX_ID)
    """Copied into the trajectory (GRPO groups)."""

    @model_validator(mode="after")
    def _one_task(self) -> RolloutRequest:
        if (self.task_id is None) == (self.task is None):
            raise RequestFieldsError("give exactly one of task_id (a task of the dataset) or task (a task object)")
        return self


class RolloutResult(Wire):
    """A finished episode with its token data (see ``agentrl.core.types.Trajectory``)."""

    trajectory: Trajectory
    """Prompt and completion token ids, loss mask, logprobs, messages, reward, stop reason, timings."""


class Health(Wire):
    """``GET /health``."""

    status: Literal["ok"] = "ok"
    """Always ``ok`` when the server answers."""
    sessions: int
    """Open sessions."""
    envs: list[str]
    """Environments served."""
    version: str
    """agentrl version."""
