"""The orchestrator: a run's driver. Rollout producers fill the bounded buffer, the loop hands batches to the
trainer and publishes each new policy version to the engines; evaluation, run directories and metrics.

- :mod:`agentrl.orchestrator.run`: `TrainingRun`, one run from start to final adapter;
- :mod:`agentrl.orchestrator.loop`: `Orchestrator`, producers → buffer → trainer → publish;
- :mod:`agentrl.orchestrator.buffer`: the bounded, staleness-aware rollout buffer;
- :mod:`agentrl.orchestrator.samples`: trajectories → trainer samples and group advantages (no torch);
- :mod:`agentrl.orchestrator.evaluate`, :mod:`agentrl.orchestrator.rundir`,
  :mod:`agentrl.orchestrator.metrics`: held-out evaluation, run directories, JSONL metrics and plots.
"""
