from inventory import Inventory, format_money, stock_report


def test_format_money():
    """Amounts get a symbol, thousands separators and two decimals."""
    assert format_money(1234.5) == "$1,234.50"


def test_format_money_millions():
    """Several thousands separators are inserted."""
    assert format_money(1234567) == "$1,234,567.00"


def test_format_money_small_and_negative():
    """Small and negative amounts are formatted too."""
    assert (format_money(0.05), format_money(-12)) == ("$0.05", "-$12.00")


def test_format_money_symbol():
    """The currency symbol can be changed."""
    assert format_money(999.999, symbol="€") == "€1,000.00"


def _inventory():
    inv = Inventory()
    inv.add("pear", 20, unit_price=0.5)
    inv.add("apple", 3, unit_price=1.0)
    inv.add("fig", 8, unit_price=2.0)
    return inv


def test_stock_report_sorted_by_name():
    """The report lists items by name and marks the ones to reorder."""
    lines = stock_report(_inventory()).splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["*", "fig", "pear"]
    assert lines[0].split()[1] == "apple"


def test_stock_report_low_first():
    """With low_first the items with the least stock come first."""
    lines = stock_report(_inventory(), low_first=True).splitlines()
    assert [line.split()[-3] for line in lines[:3]] == ["apple", "fig", "pear"]


def test_stock_report_total():
    """The last line is the total value."""
    assert stock_report(_inventory()).splitlines()[-1].split() == ["TOTAL", "$29.00"]
