"""Parse durations such as ``"1h30m"``, ``"2 days 4 hours"`` or ``"90"`` (seconds)."""

import re

from durations.units import UNITS, canonical_unit

_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*,?")


class DurationError(ValueError):
    """The text is not a duration."""


def parse_duration(text, default_unit="s"):
    """Seconds in ``text`` (an int when whole). A bare number is in ``default_unit``.

    A leading ``-`` makes the duration negative. Each unit may appear only once.
    """
    text = text.strip()
    if not text:
        raise DurationError("empty duration")
    sign = 1
    if text.startswith("-"):
        sign = -1
        text = text[1:].lstrip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        unit = canonical_unit(default_unit)
        if unit is None:
            raise DurationError(f"unknown unit {default_unit!r}")
        total = float(text) * UNITS[unit]
    else:
        total = 0.0
        seen = set()
        pos = 0
        while pos < len(text):
            match = _PART.match(text, pos)
            if match is None:
                raise DurationError(f"cannot parse {text[pos:]!r}")
            unit = canonical_unit(match.group(2))
            if unit is None:
                raise DurationError(f"unknown unit {match.group(2)!r}")
            if unit in seen:
                raise DurationError(f"unit {unit!r} given twice")
            seen.add(unit)
            total += float(match.group(1)) * UNITS[unit]
            pos = match.end()
    total *= sign
    return int(total) if total == int(total) else total
