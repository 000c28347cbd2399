import pytest

from tinycsv import read_csv

DATA = "fruit,shop,qty\napple,north,3\npear,south,\nfig,north,7\napple,south,2\n"


def test_column():
    """A column lists its values in row order."""
    assert read_csv(DATA).column("qty") == [3, None, 7, 2]


def test_column_skip_none():
    """Missing values can be skipped."""
    assert read_csv(DATA).column("qty", skip_none=True) == [3, 7, 2]


def test_column_unknown():
    """Unknown columns raise KeyError."""
    with pytest.raises(KeyError):
        read_csv(DATA).column("price")


def test_select():
    """select keeps only the given columns, in the given order."""
    table = read_csv(DATA).select("qty", "fruit")
    assert (table.columns, table.rows[0]) == (["qty", "fruit"], {"qty": 3, "fruit": "apple"})


def test_where():
    """where keeps the rows that match."""
    assert read_csv(DATA).where("shop", lambda s: s == "north").column("fruit") == ["apple", "fig"]


def test_sort_by_none_last():
    """Sorting puts missing values last."""
    assert read_csv(DATA).sort_by("qty").column("qty") == [2, 3, 7, None]


def test_sort_by_descending_none_last():
    """Missing values stay last when sorting in descending order."""
    assert read_csv(DATA).sort_by("qty", descending=True).column("qty") == [7, 3, 2, None]


def test_group_sum():
    """group_sum adds values per key, skipping missing values."""
    assert read_csv(DATA).group_sum("fruit", "qty") == {"apple": 5, "fig": 7}


def test_head():
    """head returns the first rows."""
    assert read_csv(DATA).head(2).column("fruit") == ["apple", "pear"]
