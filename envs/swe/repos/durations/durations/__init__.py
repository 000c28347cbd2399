"""durations: human durations and calendar arithmetic."""

from durations.calendar import add_months, business_days, days_in_month, is_leap_year, week_number
from durations.fmt import format_clock, format_duration
from durations.parse import DurationError, parse_duration

__all__ = [
    "DurationError",
    "add_months",
    "business_days",
    "days_in_month",
    "format_clock",
    "format_duration",
    "is_leap_year",
    "parse_duration",
    "week_number",
]
