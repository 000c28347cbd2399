"""inventory: stock keeping, pricing and reports for a small shop."""

from inventory.pricing import bulk_discount, line_total, price_order
from inventory.report import format_money, stock_report
from inventory.stock import Inventory, Item, OutOfStock

__all__ = [
    "Inventory",
    "Item",
    "OutOfStock",
    "bulk_discount",
    "format_money",
    "line_total",
    "price_order",
    "stock_report",
]
