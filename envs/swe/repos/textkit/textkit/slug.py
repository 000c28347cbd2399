"""URL slugs."""

import unicodedata

_SEPARATORS = " _-./"


def _ascii(text):
    normalized = unicodedata.normalize("NFKD", text)
    return normalized.encode("ascii", "ignore").decode("ascii")


def slugify(text, sep="-", max_length=0):
    """Lower-case ASCII slug of ``text``.

    Letters and digits are kept, runs of separators become one ``sep``, other characters are dropped.
    With ``max_length`` > 0 the slug is cut at a word boundary so that it is at most that long.
    """
    words = []
    current = []
    for ch in _ascii(text).lower():
        if ch.isalnum():
            current.append(ch)
        elif ch in _SEPARATORS:
            if current:
                words.append("".join(current))
                current = []
    if current:
        words.append("".join(current))
    slug = sep.join(words)
    if max_length > 0 and len(slug) > max_length:
        cut = slug[: max_length + 1]
        if sep in cut:
            slug = cut[: cut.rindex(sep)]
        else:
            slug = slug[:max_length]
    return slug
