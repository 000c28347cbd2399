"""Word and character statistics."""

import re

_WORD = re.compile(r"[A-Za-z0-9']+")


def words(text):
    """The words of ``text``, lower-cased (apostrophes kept, other punctuation dropped)."""
    return [w.lower().strip("'") for w in _WORD.findall(text) if w.strip("'")]


def word_count(text):
    """Number of words in ``text``."""
    return len(words(text))


def top_words(text, n=3, stopwords=()):
    """The ``n`` most frequent words as ``(word, count)``, most frequent first, ties alphabetical."""
    counts = {}
    skip = {s.lower() for s in stopwords}
    for w in words(text):
        if w in skip:
            continue
        counts[w] = counts.get(w, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked[:n]


def char_histogram(text, letters_only=True):
    """Character -> count, lower-cased; only letters unless ``letters_only`` is False (spaces never)."""
    hist = {}
    for ch in text.lower():
        if ch.isspace():
            continue
        if letters_only and not ch.isalpha():
            continue
        hist[ch] = hist.get(ch, 0) + 1
    return hist
