"""Calendar arithmetic on ``datetime.date``."""

import datetime

_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap_year(year):
    """Gregorian leap years: every 4 years, except centuries not divisible by 400."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    """Number of days in ``month`` (1-12) of ``year``."""
    if not 1 <= month <= 12:
        raise ValueError("month must be in 1..12")
    if month == 2 and is_leap_year(year):
        return 29
    return _DAYS[month - 1]


def add_months(date, months):
    """``date`` moved by ``months`` (may be negative); the day is clamped to the end of the month."""
    index = date.year * 12 + (date.month - 1) + months
    year, month = divmod(index, 12)
    month += 1
    day = min(date.day, days_in_month(year, month))
    return datetime.date(year, month, day)


def business_days(start, end, holidays=()):
    """Weekdays from ``start`` up to but not including ``end``, minus ``holidays``."""
    if end < start:
        return -business_days(end, start, holidays)
    skip = set(holidays)
    count = 0
    day = start
    while day < end:
        if day.weekday() < 5 and day not in skip:
            count += 1
        day += datetime.timedelta(days=1)
    return count


def week_number(date, first_weekday=0):
    """Week of the year, counting from 1; weeks start on ``first_weekday`` (0 = Monday) and week 1 is
    the week containing January 1st."""
    jan1 = datetime.date(date.year, 1, 1)
    offset = (jan1.weekday() - first_weekday) % 7
    return (date - jan1).days // 7 + 1 if offset == 0 else ((date - jan1).days + offset) // 7 + 1
