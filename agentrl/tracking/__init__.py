"""What a run shows outside its own directory: experiment trackers, rollout tables and model cards.

- :mod:`agentrl.tracking.records`: a ``metrics.jsonl`` record as ``<kind>/<key>`` scalars and histograms;
- :mod:`agentrl.tracking.base`: the :class:`~agentrl.tracking.base.Tracker` interface and its context;
- :mod:`agentrl.tracking.registry`: tracker names (``tensorboard``, ``wandb``, ``trackio``, ``mlflow``,
  ``package.module:Class``) to classes, each library imported only when chosen;
- :mod:`agentrl.tracking.hub`: the run's trackers on a thread of their own, a failing one reported once;
- :mod:`agentrl.tracking.samples`: sample episodes as rows (``samples/step_N.jsonl`` and tables);
- :mod:`agentrl.tracking.show`: ``agentrl show``, the samples printed for a terminal;
- :mod:`agentrl.tracking.card`: the model card of a run's final adapter or model.
"""
