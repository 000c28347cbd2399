from textkit import camel_to_snake, snake_to_camel, title_case


def test_camel_to_snake_simple():
    """camelCase becomes snake_case."""
    assert camel_to_snake("parseResponse") == "parse_response"


def test_camel_to_snake_acronym():
    """An acronym inside a name stays one word."""
    assert camel_to_snake("parseHTTPResponse") == "parse_http_response"


def test_camel_to_snake_leading_capital():
    """A leading capital does not produce a leading underscore."""
    assert camel_to_snake("HttpServer") == "http_server"


def test_camel_to_snake_already_snake():
    """Snake case input is left alone."""
    assert camel_to_snake("already_snake") == "already_snake"


def test_snake_to_camel():
    """snake_case becomes camelCase."""
    assert snake_to_camel("parse_http_response") == "parseHttpResponse"


def test_snake_to_camel_upper_first():
    """With upper_first the first word is capitalized too."""
    assert snake_to_camel("parse_http_response", upper_first=True) == "ParseHttpResponse"


def test_snake_to_camel_ignores_extra_underscores():
    """Leading, trailing and doubled underscores are ignored."""
    assert snake_to_camel("__private__name_") == "privateName"


def test_snake_to_camel_empty():
    """Only underscores give an empty name."""
    assert snake_to_camel("___") == ""


def test_title_case_small_words():
    """Small words stay lower-case in the middle of a title."""
    assert title_case("the lord of the rings") == "The Lord of the Rings"


def test_title_case_small_word_last():
    """A small word at the end is capitalized."""
    assert title_case("something to hold on to") == "Something to Hold on To"


def test_title_case_normalizes_shouting():
    """Words in capitals are normalized."""
    assert title_case("WAR AND PEACE") == "War and Peace"
