import pytest
from minilib.text import (
    camel_to_snake,
    common_prefix,
    is_palindrome,
    slugify,
    snake_to_camel,
    truncate,
    word_count,
    wrap,
)


def test_slugify_basic():
    assert slugify("Hello World") == "hello-world"


def test_slugify_strips_separators_at_the_ends():
    assert slugify("  Hello, World!  ") == "hello-world"
    assert slugify("--already--slugged--") == "already-slugged"


def test_slugify_custom_separator():
    assert slugify("Rein RL: agents", separator="_") == "rein_rl_agents"


def test_truncate_short_text_unchanged():
    assert truncate("short", 10) == "short"


def test_truncate_exact_length_unchanged():
    assert truncate("exactly10!", 10) == "exactly10!"


def test_truncate_respects_max_length():
    result = truncate("a fairly long sentence", 10)
    assert result == "a fairl..."
    assert len(result) == 10


def test_truncate_tiny_limit():
    assert truncate("abcdef", 2) == ".."
    with pytest.raises(ValueError):
        truncate("abc", -1)


def test_wrap_basic():
    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]


def test_wrap_line_exactly_width():
    assert wrap("aaaa bbbb cccc", 9) == ["aaaa bbbb", "cccc"]


def test_wrap_long_word_and_empty():
    assert wrap("supercalifragilistic is long", 5) == ["supercalifragilistic", "is", "long"]
    assert wrap("   ", 5) == []


def test_word_count_basic():
    assert word_count("a b a") == {"a": 2, "b": 1}


def test_word_count_is_case_insensitive():
    assert word_count("The cat and the hat. THE end") == {"the": 3, "cat": 1, "and": 1, "hat": 1, "end": 1}


def test_word_count_apostrophes():
    assert word_count("don't 'quote' me") == {"don't": 1, "quote": 1, "me": 1}


def test_camel_to_snake_simple():
    assert camel_to_snake("parseResponse") == "parse_response"
    assert camel_to_snake("already_snake") == "already_snake"


def test_camel_to_snake_acronyms():
    assert camel_to_snake("parseHTTPResponse") == "parse_http_response"
    assert camel_to_snake("XMLParser") == "xml_parser"


def test_snake_to_camel_default_lower_first():
    assert snake_to_camel("parse_http_response") == "parseHttpResponse"


def test_snake_to_camel_upper_first():
    assert snake_to_camel("parse_http_response", upper_first=True) == "ParseHttpResponse"
    assert snake_to_camel("__") == ""


def test_is_palindrome_simple():
    assert is_palindrome("level")
    assert not is_palindrome("levels")


def test_is_palindrome_ignores_case_and_punctuation():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert is_palindrome("Racecar")


def test_common_prefix():
    assert common_prefix(["interval", "internet", "interior"]) == "inter"
    assert common_prefix([]) == ""


def test_common_prefix_with_shorter_word():
    assert common_prefix(["flower", "flow", "flight"]) == "fl"
    assert common_prefix(["abc", "ab"]) == "ab"
