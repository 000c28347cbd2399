"""The transport registry pairs every transport's config class, publisher half and engine half: nothing
registered is missing on either side, and nothing on either side is left out of the registry."""

from __future__ import annotations

import importlib
import inspect

from agentrl.config.sync import TRANSPORTS as CONFIGS
from agentrl.engine.extension import WorkerExtension
from agentrl.weight_sync.registry import TRANSPORTS


def test_every_config_but_auto_has_its_two_halves() -> None:
    assert set(TRANSPORTS) == set(CONFIGS) - {"auto"}
    for name, t in TRANSPORTS.items():
        assert t.config is CONFIGS[name] and t.config().transport == name
        publisher = importlib.import_module(f"agentrl.weight_sync.{name}")
        assert t.open is publisher.open_publisher, f"{name}: its publisher half is agentrl/weight_sync/{name}.py"
        assert (t.engine is None) == bool(t.engine_api), f"{name}: an engine module, or vLLM's own API, not both"


def test_the_engine_halves_are_the_worker_extension() -> None:
    """Each engine module is named as its transport, is mixed into the worker extension, and defines the
    worker methods its publisher calls (the shared probe and control methods are the extension's)."""
    mixins = set(inspect.getmro(WorkerExtension))
    called: set[str] = set()
    for name, t in TRANSPORTS.items():
        called |= set(t.methods)
        for method in t.methods:
            assert callable(getattr(WorkerExtension, method, None)), f"{name}: the engine has no {method}"
        if t.engine is None:
            continue
        assert t.engine == f"agentrl.engine.transports.{name}"
        module = importlib.import_module(t.engine)
        own = [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == t.engine and c in mixins]
        assert len(own) == 1, f"{t.engine}: one mixin of WorkerExtension"
        defined = {m for m in vars(own[0]) if m.startswith("agentrl_")}
        assert defined and defined <= set(t.methods), f"{name}: {sorted(defined - set(t.methods))} not registered"
    transport_modules = {c.__module__ for c in mixins if c.__module__.startswith("agentrl.engine.transports.")}
    assert transport_modules == {t.engine for t in TRANSPORTS.values() if t.engine}
