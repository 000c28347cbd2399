import pytest

from tinycsv import CsvError, parse_line, read_csv


def test_parse_plain_line():
    """Fields are split on the delimiter."""
    assert parse_line("a,b,c") == ["a", "b", "c"]


def test_parse_quoted_delimiter():
    """A quoted field may contain the delimiter."""
    assert parse_line('x,"a,b",y') == ["x", "a,b", "y"]


def test_parse_doubled_quotes():
    """Doubled quotes inside a quoted field are one quote."""
    assert parse_line('"say ""hi""",2') == ['say "hi"', "2"]


def test_parse_empty_fields():
    """Empty fields are kept, also at the end."""
    assert parse_line("a,,b,") == ["a", "", "b", ""]


def test_parse_other_delimiter():
    """The delimiter can be changed."""
    assert parse_line("a;b,c", delimiter=";") == ["a", "b,c"]


def test_unterminated_quote():
    """An unterminated quote is an error."""
    with pytest.raises(CsvError):
        parse_line('a,"b')


def test_read_converts_types():
    """Values are converted to numbers, booleans and None."""
    table = read_csv("name,qty,price,ok,note\napple,3,0.5,yes,\n")
    assert table.rows[0] == {"name": "apple", "qty": 3, "price": 0.5, "ok": True, "note": None}


def test_read_without_conversion():
    """Conversion can be turned off."""
    assert read_csv("a,b\n1,x\n", convert_types=False).rows == [{"a": "1", "b": "x"}]


def test_read_skips_blank_lines():
    """Blank lines are skipped."""
    assert len(read_csv("a\n1\n\n2\n")) == 2


def test_read_header_is_stripped():
    """Column names are stripped of spaces."""
    assert read_csv(" a , b \n1,2\n").columns == ["a", "b"]


def test_read_wrong_field_count():
    """Rows must have as many fields as the header; the error names the line."""
    with pytest.raises(CsvError, match="line 3"):
        read_csv("a,b\n1,2\n3\n")


def test_read_empty_text():
    """Empty text has no header."""
    with pytest.raises(CsvError):
        read_csv("\n\n")
