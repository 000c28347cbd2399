"""The policy endpoint: an OpenAI-compatible chat server in front of the engines that records every call of
an external agent program as token-faithful training rows (see ``docs/blackbox.md``).

- :mod:`agentrl.config.policy`: typed settings of the endpoint and of black-box training;
- :mod:`agentrl.policy.messages`: OpenAI chat requests, checked and normalised;
- :mod:`agentrl.policy.rows`: stitching calls into rows (the token contract);
- :mod:`agentrl.policy.episodes`: per-episode credentials, rewards, TTL;
- :mod:`agentrl.policy.service`: one chat completion: render, generate, parse, record;
- :mod:`agentrl.policy.app`: the FastAPI routes; :mod:`agentrl.policy.run`: serving them;
- :mod:`agentrl.policy.blackbox`: training runs that launch unmodified agent programs.
"""
