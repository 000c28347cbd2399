"""Items and stock movements."""

from dataclasses import dataclass, field


class OutOfStock(Exception):
    """Not enough units of an item."""


@dataclass
class Item:
    name: str
    quantity: int = 0
    unit_price: float = 0.0
    reorder_level: int = 5
    history: list = field(default_factory=list)

    @property
    def value(self):
        return self.quantity * self.unit_price


class Inventory:
    """Items by name, with a history of stock movements."""

    def __init__(self):
        self.items = {}

    def add(self, name, quantity, unit_price=None, reorder_level=5):
        """Add ``quantity`` units of ``name`` (creating the item); a given ``unit_price`` replaces the old one."""
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        item = self.items.get(name)
        if item is None:
            item = Item(name, 0, unit_price or 0.0, reorder_level)
            self.items[name] = item
        elif unit_price is not None:
            item.unit_price = unit_price
        item.quantity += quantity
        item.history.append(("in", quantity))
        return item

    def remove(self, name, quantity):
        """Take ``quantity`` units out; raises OutOfStock when there are not enough."""
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        item = self.items.get(name)
        available = item.quantity if item else 0
        if quantity > available:
            raise OutOfStock(f"{name}: requested {quantity}, available {available}")
        item.quantity -= quantity
        item.history.append(("out", quantity))
        return item.quantity

    def quantity(self, name):
        """Units of ``name`` in stock (0 for unknown items)."""
        item = self.items.get(name)
        return item.quantity if item else 0

    def needs_reorder(self):
        """Names of the items at or below their reorder level, sorted."""
        return sorted(name for name, item in self.items.items() if item.quantity <= item.reorder_level)

    def total_value(self):
        """Value of all stock."""
        return sum(item.value for item in self.items.values())

    def movements(self, name, kind=None):
        """The stock movements of ``name``, optionally only ``"in"`` or ``"out"`` ones."""
        item = self.items.get(name)
        if item is None:
            return []
        return [m for m in item.history if kind is None or m[0] == kind]
