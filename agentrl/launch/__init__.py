"""Launching a run's processes: device placement, the inference stack (model, servers, client, chat format)
and ``agentrl doctor``'s pre-flight checks of a model directory."""
