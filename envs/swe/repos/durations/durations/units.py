"""Unit names and their length in seconds."""

UNITS = {
    "w": 7 * 24 * 3600,
    "d": 24 * 3600,
    "h": 3600,
    "m": 60,
    "s": 1,
}

ALIASES = {
    "week": "w",
    "weeks": "w",
    "day": "d",
    "days": "d",
    "hour": "h",
    "hours": "h",
    "hr": "h",
    "min": "m",
    "mins": "m",
    "minute": "m",
    "minutes": "m",
    "sec": "s",
    "secs": "s",
    "second": "s",
    "seconds": "s",
}


def canonical_unit(name):
    """The one-letter unit for ``name`` (``"mins"`` -> ``"m"``), or None when unknown."""
    name = name.lower()
    if name in UNITS:
        return name
    return ALIASES.get(name)
