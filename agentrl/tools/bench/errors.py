"""The errors several benchmarks raise: an argument a benchmark cannot use, a run that could not be measured,
and a run with nothing to summarise. (A benchmark's CLI still ends with ``SystemExit`` for its exit code.)

This module imports only :mod:`agentrl.core.errors`: every benchmark may import it."""

from __future__ import annotations

from agentrl.core.errors import AgentRLError, ConfigError

__all__ = ["BenchArgumentError", "BenchFailed", "BenchUnavailable", "NoMeasurements"]


class BenchArgumentError(ConfigError, ValueError):
    """A benchmark's argument cannot be used: an unknown name, sizes that do not fit together, or a server
    that does not serve what the benchmark was pointed at."""

    code = "config.bench_argument"


class BenchFailed(AgentRLError, RuntimeError):
    """A benchmark could not run to its measurement: a server it started or talks to failed, an engine did
    not do what the benchmark asked of it, or a simulation stalled."""

    code = "bench.failed"


class BenchUnavailable(AgentRLError, RuntimeError):
    """A benchmark needs something this machine cannot provide (a peer framework that cannot be installed
    or whose requirements are not met): it stops with one sentence, before anything is measured."""

    code = "bench.unavailable"


class NoMeasurements(AgentRLError, ValueError):
    """A benchmark's figures were asked for with nothing measured (no syncs, no groups, no sampled tokens)."""

    code = "bench.no_measurements"
