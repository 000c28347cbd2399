"""The policy endpoint: an OpenAI-compatible chat server in front of the engines that records every call of
an external agent program as token-faithful training rows (see ``docs/blackbox.md``).

- :mod:`agentrl.config.policy`: typed settings of the endpoint and of black-box training;
- :mod:`agentrl.http.policy.messages`: OpenAI chat requests, checked and normalised;
- :mod:`agentrl.http.policy.rows`: stitching calls into rows (the token contract);
- :mod:`agentrl.http.policy.episodes`: per-episode credentials, rewards, TTL;
- :mod:`agentrl.http.policy.service`: one chat completion: render, generate, parse, record;
- :mod:`agentrl.http.policy.app`: the FastAPI routes; :mod:`agentrl.http.policy.run`: serving them;
- :mod:`agentrl.http.policy.blackbox`: training runs that launch unmodified agent programs.
"""
