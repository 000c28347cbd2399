"""Text reports."""


def format_money(amount, symbol="$"):
    """``1234.5`` -> ``$1,234.50``; negative amounts get a leading minus."""
    sign = "-" if amount < 0 else ""
    whole, cents = divmod(round(abs(amount) * 100), 100)
    groups = []
    digits = str(whole)
    while len(digits) > 3:
        groups.insert(0, digits[-3:])
        digits = digits[:-3]
    groups.insert(0, digits)
    return f"{sign}{symbol}{','.join(groups)}.{cents:02d}"


def stock_report(inventory, low_first=False):
    """One line per item, ``name  quantity  value``, sorted by name (or by quantity with ``low_first``),
    and a total line. Items that need reordering are marked with ``*``."""
    items = list(inventory.items.values())
    if low_first:
        items.sort(key=lambda item: (item.quantity, item.name))
    else:
        items.sort(key=lambda item: item.name)
    width = max([len(item.name) for item in items] + [5])
    reorder = set(inventory.needs_reorder())
    lines = []
    for item in items:
        mark = "*" if item.name in reorder else " "
        lines.append(f"{mark} {item.name.ljust(width)}  {item.quantity:>5}  {format_money(item.value):>12}")
    lines.append(f"  {'TOTAL'.ljust(width)}  {'':>5}  {format_money(inventory.total_value()):>12}")
    return "\n".join(lines)
