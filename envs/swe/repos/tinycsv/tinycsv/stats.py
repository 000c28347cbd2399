"""Column statistics."""

import math


def _values(values):
    out = [v for v in values if v is not None]
    if not out:
        raise ValueError("no values")
    return out


def mean(values):
    """Arithmetic mean, ignoring None."""
    values = _values(values)
    return sum(values) / len(values)


def median(values):
    """Middle value (mean of the two middle ones for an even count), ignoring None."""
    values = sorted(_values(values))
    mid = len(values) // 2
    if len(values) % 2 == 1:
        return values[mid]
    return (values[mid - 1] + values[mid]) / 2


def percentile(values, p):
    """The ``p``-th percentile (0-100) with linear interpolation between closest ranks."""
    if not 0 <= p <= 100:
        raise ValueError("p must be in 0..100")
    values = sorted(_values(values))
    rank = (len(values) - 1) * p / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return values[low]
    return values[low] + (values[high] - values[low]) * (rank - low)


def stdev(values, sample=True):
    """Standard deviation (sample by default, population with ``sample=False``), ignoring None."""
    values = _values(values)
    n = len(values)
    if sample and n < 2:
        raise ValueError("sample standard deviation needs two values")
    m = sum(values) / n
    squares = sum((v - m) ** 2 for v in values)
    return math.sqrt(squares / (n - 1 if sample else n))
