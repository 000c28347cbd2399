import pytest

from durations import DurationError, parse_duration


def test_compact():
    """Compact durations are parsed."""
    assert parse_duration("1h30m") == 5400


def test_words_and_spaces():
    """Unit names may be written out, with spaces and commas."""
    assert parse_duration("2 days, 4 hours") == 187200


def test_weeks():
    """Weeks are seven days."""
    assert parse_duration("1w") == 604800


def test_fractions():
    """Fractional amounts are allowed."""
    assert parse_duration("1.5h") == 5400


def test_fraction_result_is_float():
    """A non-whole result stays a float."""
    assert parse_duration("1.5s") == 1.5


def test_bare_number_default_seconds():
    """A bare number is seconds."""
    assert parse_duration("90") == 90


def test_bare_number_default_unit():
    """The unit of a bare number can be chosen."""
    assert parse_duration("3", default_unit="min") == 180


def test_negative():
    """A leading minus makes the duration negative."""
    assert parse_duration("-1m30s") == -90


def test_case_insensitive_units():
    """Unit names ignore case."""
    assert parse_duration("2H 5M") == 7500


def test_unit_twice_rejected():
    """The same unit may not be given twice."""
    with pytest.raises(DurationError):
        parse_duration("1h 2h")


def test_unknown_unit():
    """Unknown units are rejected."""
    with pytest.raises(DurationError):
        parse_duration("3 fortnights")


def test_empty():
    """Empty text is rejected."""
    with pytest.raises(DurationError):
        parse_duration("  ")
