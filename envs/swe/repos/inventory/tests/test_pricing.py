import pytest

from inventory import bulk_discount, line_total, price_order
from inventory.pricing import apply_coupon


def test_no_discount_for_small_orders():
    """Fewer than ten units get no discount."""
    assert bulk_discount(9) == 0.0


def test_discount_tiers():
    """Each tier starts exactly at its minimum quantity."""
    assert [bulk_discount(q) for q in (10, 49, 50, 100, 500)] == [0.05, 0.05, 0.10, 0.15, 0.15]


def test_line_total_with_bulk_discount():
    """Line totals include the bulk discount."""
    assert line_total(2.0, 10) == 19.0


def test_line_total_explicit_discount():
    """An explicit discount rate replaces the bulk discount."""
    assert line_total(4.0, 10, discount=0.5) == 20.0


def test_line_total_rejects_negative():
    """Negative quantities are rejected."""
    with pytest.raises(ValueError):
        line_total(1.0, -1)


def test_percent_coupon():
    """A percentage coupon takes that share off."""
    assert apply_coupon(80.0, "25%") == 60.0


def test_fixed_coupon_never_negative():
    """A fixed coupon cannot push the amount below zero."""
    assert apply_coupon(3.0, "5") == 0.0


def test_coupon_percentage_out_of_range():
    """Percentages above 100 are rejected."""
    with pytest.raises(ValueError):
        apply_coupon(10.0, "120%")


def test_price_order():
    """An order adds its lines, then tax."""
    assert price_order([(1.0, 5), (2.5, 2)]) == {"subtotal": 10.0, "discounted": 10.0, "tax": 2.0, "total": 12.0}


def test_price_order_coupon_before_tax():
    """Coupons are applied before tax."""
    assert price_order([(10.0, 2)], tax_rate=0.1, coupon="10%")["total"] == 19.8


def test_price_order_zero_tax():
    """A zero tax rate adds nothing."""
    assert price_order([(3.0, 1)], tax_rate=0)["total"] == 3.0
