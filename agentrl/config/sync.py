"""How a run's trained policy reaches the engines: one config class per weight-sync transport, under the one
setting ``pipeline.weight_sync`` (a table whose ``transport`` names the class; a bare name is that transport
with its defaults: ``weight_sync = "merged"``).

=========== ============================================================================== ==============
transport   what crosses, and what the engines do with it                                  serves
=========== ============================================================================== ==============
``shm``     the adapter, copied in place into the engines' LoRA slots through shared       adapter
            memory (engines on other hosts: in the call body; an engine that refuses:
            files)
``network`` the adapter in the call body for every engine, copied in place into its slot   adapter
``file``    the adapter written to disk and loaded with vLLM's ``load_lora_adapter``        adapter
``merged``  the adapter, merged by engines without LoRA into their base weights            merged
``full``    every weight, in buckets through shared memory (other hosts: the call body)   full
``nccl``    every weight, over vLLM's NCCL weight-transfer engine (GPU engines)            full
``auto``    the first of ``shm`` (or ``network``), ``merged``, ``full`` that can serve the  (resolved)
            run: settled by :meth:`agentrl.config.run.RunConfig.resolved`
=========== ============================================================================== ==============

Which transport may serve which run is stated once, in :func:`refusal`; ``auto`` is settled by the same rule
(:func:`settle`), so what ``agentrl train --print-config`` prints is the transport that runs. The publisher
and engine halves of each transport are in :mod:`agentrl.weight_sync.registry`.

Pure: pydantic and the standard library only, like the rest of ``agentrl.config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from agentrl.config.base import Section
from agentrl.config.errors import SettingError

Serves = Literal["adapter", "merged", "full"]
"""What engines serve from a transport: the adapter in vLLM's LoRA slots, the adapter merged into their
base weights, or whole new weights."""
Carrier = Literal["shm", "network"]
Control = Literal["socket", "http"]


class TransportConfig(Section):
    """The settings every transport shares: its name, and what the engines serve from it."""

    transport: str
    """The transport's name (the class's ``transport`` literal)."""
    serves: ClassVar[Serves | None] = None
    """What the engines serve from this transport (None: ``auto``, not settled yet)."""

    def model_post_init(self, context: Any, /) -> None:
        # the name is always a given setting, so a config rebuilt from its given settings finds the class again
        self.__pydantic_fields_set__.add("transport")


class ShmSync(TransportConfig):
    """The adapter copied in place into each engine's LoRA slot through POSIX shared memory (engines on this
    host; a probe at start tells them apart), in the call body for engines on other hosts, and through files
    for an engine that refuses the copy (no slot yet)."""

    transport: Literal["shm"] = "shm"
    serves: ClassVar[Serves] = "adapter"
    control: Control = "socket"
    """How a sync reaches an engine on this host: ``socket``, one message on the engine core's local control
    socket, run between two of its steps with the label and the reset (no HTTP round trip, no pause around
    it; engines that cannot open one keep HTTP); ``http``: every call through the engine's API server
    (``POST /collective_rpc``, the label, the reset)."""


class NetworkSync(TransportConfig):
    """The adapter in the call body for every engine (no shared memory, no shared filesystem), copied in place
    into its LoRA slot; an engine without a slot gets the adapter's files in the call once."""

    transport: Literal["network"] = "network"
    serves: ClassVar[Serves] = "adapter"


class FileSync(TransportConfig):
    """The adapter written to disk and loaded by every engine with vLLM's ``load_lora_adapter`` (in place, under
    the same name): the portable baseline; needs a filesystem the engines share."""

    transport: Literal["file"] = "file"
    serves: ClassVar[Serves] = "adapter"


class MergedSync(TransportConfig):
    """The adapter sent to engines without LoRA, which merge it into their base weights (``W0 + scaling * B @
    A`` for each module it touches, from a kept copy of the base) and generate on plain weights. vLLM's CPU
    build generates 2 to 3.5x slower from a LoRA slot, and its MoE LoRA path needs Triton; an adapter with
    tensors trained whole (norms, the embedding) has no slot to go to."""

    transport: Literal["merged"] = "merged"
    serves: ClassVar[Serves] = "merged"
    carrier: Carrier = "shm"
    """``shm``: through shared memory for engines on this host, in the call body for the others;
    ``network``: in the call body for every engine."""
    control: Control = "socket"
    """As :attr:`ShmSync.control`: a merge on an engine on this host runs between two of its steps, with no
    pause around it, over the engine core's control socket (``socket``), or paused over HTTP (``http``)."""


class FullSync(TransportConfig):
    """Every weight of a full-weight run (``trainer.lora = false``), in buckets: through a double-buffered
    shared-memory segment for engines on this host, in the call body for the others; the engines pause
    (``keep``), load, and resume."""

    transport: Literal["full"] = "full"
    serves: ClassVar[Serves] = "full"
    carrier: Carrier = "shm"
    """``shm``: shared memory for engines on this host, the call body for the others; ``network``: the call
    body for every engine."""


class NcclSync(TransportConfig):
    """Every weight of a full-weight run over vLLM's NCCL weight-transfer engine (GPU engines; the trainer needs
    vLLM importable; never measured by this project)."""

    transport: Literal["nccl"] = "nccl"
    serves: ClassVar[Serves] = "full"
    addr: str = "127.0.0.1"
    """An address of the trainer's rank-0 node that every engine's workers can reach (the NCCL rendezvous)."""


class AutoSync(TransportConfig):
    """The transport is chosen at resolution (:func:`settle`): the adapter in the engines' LoRA slots wherever
    they can serve it (``shm``, or ``network`` with ``carrier = "network"``), else merged, and full weights
    for a full-weight run. The run logs which."""

    transport: Literal["auto"] = "auto"
    carrier: Carrier = "shm"
    """How the chosen transport carries the weights: ``shm`` (shared memory for engines on this host) or
    ``network`` (the call body for every engine)."""
    control: Control = "socket"
    """As :attr:`ShmSync.control`, for the transport chosen."""


WeightSyncConfig = Annotated[ShmSync | NetworkSync | FileSync | MergedSync | FullSync | NcclSync | AutoSync,
                             Field(discriminator="transport")]
"""``pipeline.weight_sync``: one of the transport classes, by its ``transport`` name."""

TRANSPORTS: dict[str, type[TransportConfig]] = {
    c.model_fields["transport"].default: c
    for c in (ShmSync, NetworkSync, FileSync, MergedSync, FullSync, NcclSync, AutoSync)}
"""Transport name -> its config class."""


@dataclass(frozen=True)
class Served:
    """What the run asks of its weight sync: the facts :func:`refusal` decides on."""

    lora: bool
    """A LoRA run (``trainer.lora``); else full weights."""
    trains_whole: bool = False
    """The adapter carries tensors trained whole (``trainer.lora_train_norms``, ``trainer.lora_train_embedding``)."""
    moe_on_cpu: bool = False
    """A mixture-of-experts model on vLLM's CPU build, whose MoE LoRA path needs Triton."""
    output_lora: bool = False
    """The adapter has a LoRA on the output layer (``trainer.lora_train_unembed``)."""


def refusal(sync: TransportConfig, run: Served) -> str | None:
    """Why transport ``sync`` cannot serve ``run``'s policy (None: it can). The one statement of these rules."""
    name, serves = sync.transport, sync.serves
    if not run.lora and serves != "full":
        return (f"pipeline.weight_sync = {name!r} serves a LoRA adapter, but trainer.lora = false trains full "
                "weights: use 'full' (through shared memory or the call body) or 'nccl' (GPU engines), or 'auto'")
    if run.lora and serves == "full":
        return (f"pipeline.weight_sync = {name!r} streams full weights (trainer.lora = false); a LoRA run syncs its "
                "adapter with 'shm' (into the LoRA slots), 'network', 'file' or 'merged', or 'auto'")
    if serves == "adapter" and run.trains_whole:
        return (f"pipeline.weight_sync = {name!r} serves the adapter from vLLM's LoRA slots, which hold no tensor "
                "trained whole (trainer.lora_train_norms, trainer.lora_train_embedding): use 'merged' (or 'auto', "
                "which chooses it), or set those to false (calc's preset trains the embedding of the embedded model)")
    if serves == "merged" and run.output_lora:
        return (f"pipeline.weight_sync = {name!r} merges the adapter into the engines' weights, but the output layer's "
                "LoRA (trainer.lora_train_unembed) would be merged into a weight that small models tie to the input "
                "embedding: serve it from the LoRA slots ('shm', 'network', 'file', or 'auto')")
    if serves == "adapter" and run.moe_on_cpu:
        return (f"pipeline.weight_sync = {name!r} serves the adapter from LoRA slots, which vLLM's CPU build cannot "
                "run on MoE layers (its MoE LoRA path needs Triton): use 'merged' (or 'auto', which chooses it)")
    return None


def settle(sync: TransportConfig, run: Served) -> TransportConfig:
    """The transport that serves ``run``: ``sync`` itself, checked against :func:`refusal`, or for ``auto`` the
    first candidate that rule lets through. Raises :class:`~agentrl.config.errors.SettingError` when none can."""
    if isinstance(sync, AutoSync):
        slots = ShmSync(control=sync.control) if sync.carrier == "shm" else NetworkSync()
        candidates: list[TransportConfig] = [slots, MergedSync(carrier=sync.carrier, control=sync.control),
                                             FullSync(carrier=sync.carrier)]
        chosen = next((c for c in candidates if refusal(c, run) is None), None)
        if chosen is None:  # an output-layer LoRA the slots cannot serve (MoE on CPU, tensors trained whole)
            raise SettingError("pipeline.weight_sync = 'auto' finds no transport for this run: "
                               + "; ".join(str(refusal(c, run)) for c in candidates[:2]))
        return chosen
    problem = refusal(sync, run)
    if problem:
        raise SettingError(problem)
    return sync


def why_chosen(sync: TransportConfig, run: Served) -> str:
    """One line for the run's log: the settled transport ``sync``, and what made the slots refuse the adapter
    when the engines merge it."""
    if sync.serves == "merged":
        because = ("the model is a MoE on vLLM's CPU build, which cannot run LoRA on MoE layers" if run.moe_on_cpu
                   else "the adapter carries tensors trained whole, which vLLM's LoRA slots cannot hold"
                   if run.trains_whole else "as configured")
        return f"weight sync: the engines merge each published adapter into their weights ({because})"
    if sync.serves == "full":
        return f"weight sync: full weights, in buckets ({getattr(sync, 'carrier', 'shm')})"
    return f"weight sync: the adapter is copied in place into the engines' LoRA slots ({sync.transport})"
