from minilib.text import (
    camel_to_snake,
    common_prefix,
    is_palindrome,
    slugify,
    truncate,
    word_count,
    wrap,
)


def test_slugify_basic():
    assert slugify("Hello World") == "hello-world"


def test_truncate_short_text_unchanged():
    assert truncate("short", 10) == "short"


def test_wrap_basic():
    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]


def test_word_count_basic():
    assert word_count("a b a") == {"a": 2, "b": 1}


def test_camel_to_snake_simple():
    assert camel_to_snake("parseResponse") == "parse_response"
    assert camel_to_snake("already_snake") == "already_snake"


def test_is_palindrome_simple():
    assert is_palindrome("level")
    assert not is_palindrome("levels")


def test_common_prefix():
    assert common_prefix(["interval", "internet", "interior"]) == "inter"
    assert common_prefix([]) == ""
