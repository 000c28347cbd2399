"""The Tinker API, served by agentrl (``agentrl serve-tinker``): the wire protocol of the official ``tinker``
SDK (0.38) over one base model, many LoRA training clients on one in-process trainer and one vLLM engine
whose adapters the samplers read.

The parts, each a module: ``errors`` (what a request can fail with, and the SDK's error categories),
``keys`` (API keys and who owns what), ``futures`` (results polled with ``retrieve_future``),
``sequencer`` (each model's requests run in ``seq_id`` order, retries dropped), ``wire`` (the protobuf
bodies), ``losses`` (the losses by name), ``trainer`` (the base model and its named adapters),
``checkpoints`` (``tinker://`` paths under the state directory), ``sampler`` (the engine and its LoRA
slots), ``service`` (the API's operations) and ``app`` (the HTTP routes)."""
