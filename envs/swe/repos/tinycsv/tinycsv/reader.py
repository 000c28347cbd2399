"""Parse CSV text."""

from tinycsv.convert import convert
from tinycsv.table import Table


class CsvError(ValueError):
    """Malformed CSV."""


def parse_line(line, delimiter=","):
    """Fields of one CSV line. Quoted fields may hold the delimiter and doubled quotes (``""``)."""
    fields = []
    field = []
    in_quotes = False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_quotes:
            if ch == '"':
                if i + 1 < len(line) and line[i + 1] == '"':
                    field.append('"')
                    i += 1
                else:
                    in_quotes = False
            else:
                field.append(ch)
        elif ch == '"':
            in_quotes = True
        elif ch == delimiter:
            fields.append("".join(field))
            field = []
        else:
            field.append(ch)
        i += 1
    if in_quotes:
        raise CsvError(f"unterminated quote in {line!r}")
    fields.append("".join(field))
    return fields


def read_csv(text, delimiter=",", convert_types=True, skip_blank=True):
    """A Table from CSV ``text``; the first line holds the column names.

    Values become int/float/bool/None where they look like one (unless ``convert_types`` is False).
    """
    lines = text.splitlines()
    if skip_blank:
        lines = [line for line in lines if line.strip()]
    if not lines:
        raise CsvError("no header line")
    header = [name.strip() for name in parse_line(lines[0], delimiter)]
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        values = parse_line(line, delimiter)
        if len(values) != len(header):
            raise CsvError(f"line {number}: expected {len(header)} fields, got {len(values)}")
        if convert_types:
            values = [convert(v) for v in values]
        rows.append(dict(zip(header, values)))
    return Table(header, rows)
