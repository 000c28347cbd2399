import datetime

import pytest

from durations import add_months, business_days, days_in_month, is_leap_year, week_number

D = datetime.date


def test_leap_years():
    """Centuries are leap years only when divisible by 400."""
    assert [is_leap_year(y) for y in (1900, 2000, 2023, 2024)] == [False, True, False, True]


def test_days_in_month():
    """February has 29 days in leap years."""
    assert [days_in_month(2024, 2), days_in_month(2023, 2), days_in_month(2023, 12)] == [29, 28, 31]


def test_days_in_month_rejects_13():
    """Months outside 1..12 are rejected."""
    with pytest.raises(ValueError):
        days_in_month(2023, 13)


def test_add_months_simple():
    """Adding months keeps the day."""
    assert add_months(D(2023, 1, 15), 2) == D(2023, 3, 15)


def test_add_months_across_year():
    """Adding months can cross the year boundary."""
    assert add_months(D(2023, 11, 30), 3) == D(2024, 2, 29)


def test_add_months_negative():
    """Months can be subtracted."""
    assert add_months(D(2024, 1, 31), -2) == D(2023, 11, 30)


def test_add_twelve_months():
    """Adding twelve months lands on the same day next year."""
    assert add_months(D(2023, 12, 5), 12) == D(2024, 12, 5)


def test_business_days_week():
    """A full week has five business days."""
    assert business_days(D(2024, 3, 4), D(2024, 3, 11)) == 5


def test_business_days_end_excluded():
    """The end date is not counted."""
    assert business_days(D(2024, 3, 4), D(2024, 3, 5)) == 1


def test_business_days_holidays():
    """Holidays are not business days."""
    assert business_days(D(2024, 3, 4), D(2024, 3, 11), holidays=[D(2024, 3, 6)]) == 4


def test_business_days_reversed():
    """A reversed range counts negatively."""
    assert business_days(D(2024, 3, 11), D(2024, 3, 4)) == -5


def test_week_number():
    """Week 1 contains January 1st."""
    assert [week_number(D(2024, 1, 1)), week_number(D(2024, 1, 8)), week_number(D(2023, 1, 2))] == [1, 2, 2]


def test_week_number_sunday_start():
    """Weeks may start on Sunday."""
    assert week_number(D(2023, 1, 8), first_weekday=6) == 2
