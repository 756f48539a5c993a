import pytest
from minilib.durations import (
    format_duration,
    is_leap_year,
    parse_date,
    parse_duration,
)


def test_parse_units():
    assert parse_duration("90s") == 90
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d 4h") == 2 * 86400 + 4 * 3600
    assert parse_duration("1w") == 7 * 86400


def test_parse_clock_forms():
    assert parse_duration("01:30") == 90
    assert parse_duration("1:00:00") == 3600


def test_parse_rejects_garbage():
    for text in ("", "abc", "10 parsecs", "5h x", "1:2:3:4"):
        with pytest.raises(ValueError):
            parse_duration(text)


def test_format_duration():
    assert format_duration(5400) == "1h 30m"
    assert format_duration(59.9) == "59s"


def test_leap_years():
    assert is_leap_year(2024)
    assert not is_leap_year(2023)
    assert not is_leap_year(1900)


def test_parse_date():
    assert parse_date("2024-02-29") == (2024, 2, 29)
    with pytest.raises(ValueError):
        parse_date("2023-02-29")
    with pytest.raises(ValueError):
        parse_date("2024/02/01")
