"""Format seconds for humans."""

from durations.units import UNITS

_ORDER = ["w", "d", "h", "m", "s"]


def format_duration(seconds, max_units=2, sep=" "):
    """``5400`` -> ``"1h 30m"``: the largest units first, at most ``max_units`` of them, rounded down."""
    if seconds < 0:
        return "-" + format_duration(-seconds, max_units, sep)
    remaining = int(seconds)
    parts = []
    for unit in _ORDER:
        size = UNITS[unit]
        if remaining >= size:
            count, remaining = divmod(remaining, size)
            parts.append(f"{count}{unit}")
        elif parts:
            parts.append(None)
    parts = [p for p in parts[:max_units] if p]
    return sep.join(parts) if parts else "0s"


def format_clock(seconds, show_hours=True):
    """``3725`` -> ``"01:02:05"`` (``"62:05"`` without hours)."""
    if seconds < 0:
        raise ValueError("negative time")
    seconds = int(seconds)
    minutes, secs = divmod(seconds, 60)
    if not show_hours:
        return f"{minutes:02d}:{secs:02d}"
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"
