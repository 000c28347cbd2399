"""textkit: small text utilities."""

from textkit.case import camel_to_snake, snake_to_camel, title_case
from textkit.count import char_histogram, top_words, word_count
from textkit.slug import slugify
from textkit.wrap import center, truncate, wrap

__all__ = [
    "camel_to_snake",
    "center",
    "char_histogram",
    "slugify",
    "snake_to_camel",
    "title_case",
    "top_words",
    "truncate",
    "word_count",
    "wrap",
]
