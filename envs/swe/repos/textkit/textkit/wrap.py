"""Wrapping, truncating and centering lines."""


def wrap(text, width=70):
    """Greedy word wrap: lines of at most ``width`` characters (longer words get their own line)."""
    if width < 1:
        raise ValueError("width must be at least 1")
    lines = []
    line = ""
    for word in text.split():
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line = line + " " + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines


def truncate(text, limit, ellipsis="..."):
    """``text`` cut to at most ``limit`` characters, ending with ``ellipsis`` when cut."""
    if limit < len(ellipsis):
        raise ValueError("limit is shorter than the ellipsis")
    if len(text) <= limit:
        return text
    return text[: limit - len(ellipsis)] + ellipsis


def center(text, width, fill=" "):
    """``text`` centered in ``width`` columns; an odd leftover goes to the right."""
    if len(fill) != 1:
        raise ValueError("fill must be one character")
    space = width - len(text)
    if space <= 0:
        return text
    left = space // 2
    right = space - left
    return fill * left + text + fill * right
