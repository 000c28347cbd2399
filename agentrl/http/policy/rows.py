"""Stitching an episode's calls into training rows, token-faithfully.

A row is one token sequence the engine saw: the first call's prompt ids, then for each later call the
template's delta for the messages the agent added (tool results, user turns; mask 0) and the ids the
engine sampled (mask 1, with their behaviour logprobs and policy versions). A call *extends* a row (the
latest one that fits) when its messages are the row's messages so far (the requests' messages plus the answers the endpoint
gave, compared in normal form, see :mod:`agentrl.http.policy.messages`) followed by new ones, with the same
tools and temperature. Its prompt is then the row's ids plus the delta: the sampled ids are never
re-tokenized, exactly as in agentrl's own loop (the delta is cut from the template as
:meth:`agentrl.rollout.chat.ChatFormat.observation_ids` does, so templates that re-render earlier turns are
handled too). Any other call (a summarised, dropped or edited history; other tools; another temperature)
starts a new row from the full render of its messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from agentrl.core.errors import AgentRLError
from agentrl.core.masks import SamplingMask
from agentrl.core.types import Routing, TokenDataError
from agentrl.inference.wire import RoutingRows
from agentrl.rollout.loop import extend_routing


class RowChangedError(AgentRLError, RuntimeError):
    """A row changed while one of its calls was in flight (calls of one episode must be serialised)."""

    code = "policy.row_changed"


class Renderer(Protocol):
    """What stitching needs from a chat format (:class:`agentrl.rollout.chat.ChatFormat` is one)."""

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]: ...

    def observation_ids(self, new_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                        ended_with: int | None = None) -> list[int]: ...


@dataclass
class Row:
    """One token-faithful training row of an episode."""

    prompt_ids: list[int]
    tools_key: str
    temperature: float
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation so far in normal form: the last request's messages and the answer given."""
    last_token: int | None = None
    """The last id the engine sampled (closes the turn or not: see ``ChatFormat.observation_text``)."""
    calls: int = 0
    mask: SamplingMask | None = None
    """The engine's kept sets over ``completion_ids`` where sampling truncated (count 0 elsewhere), else None."""
    routing: Routing | None = None
    """MoE models: the experts the engine routed positions ``0 .. routing.n - 1`` of ``ids`` to, else None."""

    @property
    def ids(self) -> list[int]:
        """Every id of the row: what the engine saw at its last call, plus its answer."""
        return self.prompt_ids + self.completion_ids

    def as_dict(self) -> dict[str, Any]:
        out = {"prompt_ids": self.prompt_ids, "completion_ids": self.completion_ids, "loss_mask": self.loss_mask,
               "logprobs": self.logprobs, "versions": self.versions, "temperature": self.temperature,
               "calls": self.calls}
        if self.mask is not None:
            out["sampling_mask"] = self.mask.model_dump(mode="json")
        if self.routing is not None:
            out["routing"] = self.routing.model_dump(mode="json")
        return out


@dataclass
class Plan:
    """What one call sends to the engine, and where its tokens go once sampled."""

    prompt_ids: list[int]
    row: Row | None
    """The row the call extends, or None for a new row."""
    delta: list[int]
    """Template ids appended to ``row`` before the sampled ids (empty for a new row)."""
    messages: list[dict[str, Any]]
    tools_key: str
    temperature: float


def extends(row: Row, messages: list[dict[str, Any]], tools_key: str, temperature: float) -> bool:
    """Whether a call with ``messages`` continues ``row`` (see the module docstring)."""
    n = len(row.messages)
    return (row.tools_key == tools_key and row.temperature == temperature and n > 0 and len(messages) > n
            and row.messages[-1]["role"] == "assistant" and messages[:n] == row.messages)


def plan_call(rows: list[Row], chat: Renderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
              tools_key: str, temperature: float) -> Plan:
    """The prompt ids of a call: the latest row it extends (with ``n > 1`` choices, the agent continues one
    of several rows) plus the delta of the new messages, or a fresh render."""
    for row in reversed(rows):
        if extends(row, messages, tools_key, temperature):
            delta = chat.observation_ids(messages[len(row.messages):], tools, ended_with=row.last_token)
            return Plan(row.ids + delta, row, delta, messages, tools_key, temperature)
    return Plan(chat.prompt_ids(messages, tools), None, [], messages, tools_key, temperature)


def prefill(plan: Plan, ids: list[int]) -> Plan:
    """``plan`` with ``ids`` appended to its prompt: text the endpoint writes for the model (the opening of a
    forced tool call), which the model then continues. They are context in the row (mask 0, no version), not
    sampled tokens."""
    return replace(plan, prompt_ids=plan.prompt_ids + ids, delta=plan.delta + ids if plan.row is not None else [])


def fork(plan: Plan) -> Plan:
    """The plan of another choice of the same call: a new row whose prompt is the whole of the call's
    prompt (earlier sampled ids included, as context: they are trained once, in the row the first choice
    extends)."""
    return Plan(list(plan.prompt_ids), None, [], plan.messages, plan.tools_key, plan.temperature)


@dataclass
class Routed:
    """A call's routing, for a row of a MoE model: the empty record a new row starts from, the rows the engine
    returned, and the policy version the call was sent under."""

    template: Routing
    rows: RoutingRows | None
    sent: int


def commit(rows: list[Row], plan: Plan, token_ids: list[int], logprobs: list[float], versions: list[int],
           answer: dict[str, Any], mask: SamplingMask | None = None, routed: Routed | None = None) -> Row:
    """Record a sampled call: extend its row (or start one) and remember the conversation with ``answer``
    (``mask``: the sampled ids' kept sets, where sampling truncated; ``routed``: its MoE routing)."""
    if len(logprobs) != len(token_ids) or len(versions) != len(token_ids):
        raise TokenDataError(f"{len(token_ids)} sampled ids with {len(logprobs)} logprobs and {len(versions)} versions")
    row = plan.row
    if row is None:
        row = Row(prompt_ids=list(plan.prompt_ids), tools_key=plan.tools_key, temperature=plan.temperature)
        rows.append(row)
    elif row.ids + plan.delta != plan.prompt_ids:
        raise RowChangedError("the row changed while its call was in flight (calls of one episode are serialised)")
    if mask is not None and row.mask is None:
        row.mask = SamplingMask(vocab=mask.vocab, counts=[0] * len(row.completion_ids))
    if row.mask is not None:
        row.mask.pad(len(plan.delta))
        if mask is None:
            row.mask.pad(len(token_ids))
        else:
            if mask.n != len(token_ids):
                raise TokenDataError(f"{len(token_ids)} sampled ids with {mask.n} sampling masks")
            row.mask.extend(mask.counts, mask.data)
    row.completion_ids += plan.delta + list(token_ids)
    row.loss_mask += [0] * len(plan.delta) + [1] * len(token_ids)
    row.logprobs += [0.0] * len(plan.delta) + list(logprobs)
    row.versions += [-1] * len(plan.delta) + list(versions)
    if routed is not None:
        if row.routing is None:
            row.routing = routed.template.model_copy(deep=True)
        if routed.rows is not None:
            extend_routing(row.routing, routed.rows, len(plan.prompt_ids), list(versions), routed.sent)
        row.routing.truncate(len(row.ids) - 1)  # ids cut after a stop sequence: their positions go too
    row.messages = [*plan.messages, answer]
    row.last_token = token_ids[-1] if token_ids else row.last_token
    row.calls += 1
    return row
