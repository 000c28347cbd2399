"""The standard error of a rate: one definition for the reward curve's error bars and the model card."""

from __future__ import annotations

import math


def binomial_stderr(p: float, n: float | None) -> float | None:
    """The standard error ``sqrt(p (1 - p) / n)`` of a rate ``p`` (a success rate, or the mean of a 0/1
    reward) measured over ``n`` episodes; ``None`` when ``n`` is missing or not positive, or ``p`` is not
    a finite value in [0, 1]."""
    if n is None or not isinstance(n, (int, float)) or not math.isfinite(n) or n <= 0:
        return None
    if not math.isfinite(p) or not 0.0 <= p <= 1.0:
        return None
    return math.sqrt(p * (1.0 - p) / n)
