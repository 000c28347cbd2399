"""Server metrics in the Prometheus text exposition format (``GET /metrics``), without dependencies."""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"})
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    esc = (v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for _, v in labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(labels, esc, strict=True)) + "}"


class Histogram:
    """Cumulative-bucket histogram of seconds."""

    def __init__(self, buckets: tuple[float, ...] = STEP_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Record one value."""
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1


class Metrics:
    """Counters, histograms and gauges of one server; ``render()`` gives the exposition text."""

    def __init__(self) -> None:
        self.started = time.time()
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
        self._hists: dict[str, dict[tuple[tuple[str, str], ...], Histogram]] = defaultdict(dict)
        self._gauges: dict[str, Callable[[], float]] = {}
        self._help: dict[str, tuple[str, str]] = {}

    def _describe(self, name: str, kind: str, help_text: str) -> None:
        self._help.setdefault(name, (kind, help_text))

    def inc(self, name: str, help_text: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to counter ``name`` with ``labels``."""
        self._describe(name, "counter", help_text)
        key = tuple(sorted(labels.items()))
        series = self._counters[name]
        series[key] = series.get(key, 0.0) + value

    def observe(self, name: str, help_text: str, value: float, **labels: str) -> None:
        """Record ``value`` (seconds) in histogram ``name``."""
        self._describe(name, "histogram", help_text)
        key = tuple(sorted(labels.items()))
        hist = self._hists[name].get(key)
        if hist is None:
            hist = self._hists[name][key] = Histogram()
        hist.observe(value)

    def gauge(self, name: str, help_text: str, fn: Callable[[], float]) -> None:
        """Register gauge ``name``, read from ``fn`` at each scrape."""
        self._describe(name, "gauge", help_text)
        self._gauges[name] = fn

    def counter_value(self, name: str, **labels: str) -> float:
        """Current value of one counter series (0 if never incremented)."""
        return self._counters.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        """All metrics in the Prometheus text format (version 0.0.4)."""
        lines: list[str] = []
        for name in sorted(self._help):
            kind, help_text = self._help[name]
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            if kind == "counter":
                for key, value in sorted(self._counters.get(name, {}).items()):
                    lines.append(f"{name}{_labels(key)} {value:g}")
            elif kind == "gauge":
                try:
                    value = float(self._gauges[name]())
                except Exception:  # a gauge must never break the scrape
                    value = float("nan")
                lines.append(f"{name} {value:g}")
            else:
                for key, hist in sorted(self._hists.get(name, {}).items()):
                    running = 0
                    for bound, count in zip((*hist.buckets, float("inf")), hist.counts, strict=True):
                        running += count
                        le = "+Inf" if bound == float("inf") else f"{bound:g}"
                        lines.append(f"{name}_bucket{_labels((*key, ('le', le)))} {running}")
                    lines.append(f"{name}_sum{_labels(key)} {hist.sum:g}")
                    lines.append(f"{name}_count{_labels(key)} {hist.count}")
        return "\n".join(lines) + "\n"


class RequestMetrics:
    """ASGI middleware: count requests by route template, method and status, and time them."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}
        t0 = time.perf_counter()

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            labels = {
                "route": path,
                "method": method if method in _METHODS else "other",
                "status": str(status["code"]),
            }
            self.metrics.inc(
                "agentrl_env_http_requests_total", "HTTP requests by route, method and status.", **labels
            )
            self.metrics.observe(
                "agentrl_env_http_request_seconds",
                "HTTP request latency by route.",
                time.perf_counter() - t0,
                route=path,
            )
