import pytest

from inventory import Inventory, OutOfStock


def test_add_creates_item():
    """Adding stock of a new item creates it."""
    inv = Inventory()
    inv.add("apple", 10, unit_price=0.5)
    assert inv.quantity("apple") == 10


def test_add_accumulates():
    """Adding more of an item increases its quantity."""
    inv = Inventory()
    inv.add("apple", 10)
    inv.add("apple", 5)
    assert inv.quantity("apple") == 15


def test_add_keeps_price_when_not_given():
    """Restocking without a price keeps the old price."""
    inv = Inventory()
    inv.add("pear", 2, unit_price=1.25)
    inv.add("pear", 3)
    assert inv.items["pear"].unit_price == 1.25


def test_add_rejects_zero():
    """Adding zero units is an error."""
    inv = Inventory()
    with pytest.raises(ValueError):
        inv.add("apple", 0)


def test_remove():
    """Removing stock returns what is left."""
    inv = Inventory()
    inv.add("apple", 10)
    assert inv.remove("apple", 4) == 6


def test_remove_everything():
    """All units of an item can be removed."""
    inv = Inventory()
    inv.add("apple", 3)
    assert inv.remove("apple", 3) == 0


def test_remove_too_many():
    """Removing more than available raises OutOfStock and changes nothing."""
    inv = Inventory()
    inv.add("apple", 3)
    with pytest.raises(OutOfStock):
        inv.remove("apple", 4)
    assert inv.quantity("apple") == 3


def test_remove_unknown_item():
    """Removing an unknown item raises OutOfStock."""
    with pytest.raises(OutOfStock):
        Inventory().remove("ghost", 1)


def test_unknown_quantity_is_zero():
    """Unknown items have zero stock."""
    assert Inventory().quantity("ghost") == 0


def test_needs_reorder():
    """Items at or below their reorder level need reordering."""
    inv = Inventory()
    inv.add("a", 5)
    inv.add("b", 6)
    inv.add("c", 1, reorder_level=0)
    assert inv.needs_reorder() == ["a"]


def test_total_value():
    """The total value sums quantity times price."""
    inv = Inventory()
    inv.add("a", 4, unit_price=2.5)
    inv.add("b", 2, unit_price=10)
    assert inv.total_value() == 30


def test_movements():
    """Stock movements are recorded and can be filtered."""
    inv = Inventory()
    inv.add("a", 4)
    inv.remove("a", 1)
    inv.add("a", 2)
    assert inv.movements("a") == [("in", 4), ("out", 1), ("in", 2)]
    assert inv.movements("a", kind="in") == [("in", 4), ("in", 2)]
