import pytest

from durations import format_clock, format_duration


def test_two_units():
    """The two largest units are shown."""
    assert format_duration(5400) == "1h 30m"


def test_rounds_down_to_two_units():
    """Smaller units beyond the limit are dropped."""
    assert format_duration(3725) == "1h 2m"


def test_skipped_middle_unit_counts():
    """A zero unit in the middle still counts toward the limit."""
    assert format_duration(3605) == "1h"


def test_more_units():
    """max_units can show more detail."""
    assert format_duration(93784, max_units=4) == "1d 2h 3m 4s"


def test_weeks():
    """Weeks are used for long durations."""
    assert format_duration(8 * 86400) == "1w 1d"


def test_zero():
    """Zero is 0s."""
    assert format_duration(0) == "0s"


def test_negative():
    """Negative durations get a minus sign."""
    assert format_duration(-90) == "-1m 30s"


def test_custom_separator():
    """The separator can be changed."""
    assert format_duration(5400, sep="") == "1h30m"


def test_clock():
    """Clock format pads every field."""
    assert format_clock(3725) == "01:02:05"


def test_clock_without_hours():
    """Without hours, minutes may exceed 59."""
    assert format_clock(3725, show_hours=False) == "62:05"


def test_clock_negative():
    """Negative times are rejected."""
    with pytest.raises(ValueError):
        format_clock(-1)
