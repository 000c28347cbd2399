"""Prices: bulk discounts, coupons and tax."""

BULK_TIERS = [(100, 0.15), (50, 0.10), (10, 0.05)]
"""(minimum quantity, discount rate), largest first."""


def bulk_discount(quantity, tiers=BULK_TIERS):
    """The discount rate for buying ``quantity`` units."""
    for minimum, rate in tiers:
        if quantity >= minimum:
            return rate
    return 0.0


def line_total(unit_price, quantity, discount=None):
    """Price of one order line after the bulk discount (or the given ``discount`` rate), in cents precision."""
    if quantity < 0 or unit_price < 0:
        raise ValueError("negative price or quantity")
    rate = bulk_discount(quantity) if discount is None else discount
    return round(unit_price * quantity * (1 - rate), 2)


def apply_coupon(amount, coupon):
    """``amount`` after a coupon: ``"10%"`` takes a percentage off, ``"5"`` takes a fixed amount off (never below 0)."""
    coupon = coupon.strip()
    if coupon.endswith("%"):
        percent = float(coupon[:-1])
        if not 0 <= percent <= 100:
            raise ValueError("percentage out of range")
        return round(amount * (1 - percent / 100), 2)
    return max(0.0, round(amount - float(coupon), 2))


def price_order(lines, tax_rate=0.2, coupon=None):
    """Total of an order: ``lines`` are (unit_price, quantity) pairs; the coupon applies before tax.

    Returns a dict with ``subtotal``, ``discounted``, ``tax`` and ``total``.
    """
    subtotal = round(sum(line_total(price, qty) for price, qty in lines), 2)
    discounted = apply_coupon(subtotal, coupon) if coupon else subtotal
    tax = round(discounted * tax_rate, 2)
    return {"subtotal": subtotal, "discounted": discounted, "tax": tax, "total": round(discounted + tax, 2)}
