"""tinycsv: CSV tables and column statistics."""

from tinycsv.reader import CsvError, parse_line, read_csv
from tinycsv.stats import mean, median, percentile, stdev
from tinycsv.table import Table

__all__ = ["CsvError", "Table", "mean", "median", "parse_line", "percentile", "read_csv", "stdev"]
