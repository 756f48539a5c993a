import pytest
from minilib.durations import (
    add_days,
    day_of_year,
    days_in_month,
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


def test_parse_fractional_units():
    assert parse_duration("1.5h") == 5400
    assert parse_duration("0.5m") == 30


def test_parse_clock_forms():
    assert parse_duration("01:30") == 90
    assert parse_duration("1:00:00") == 3600


def test_parse_clock_rejects_sixty():
    with pytest.raises(ValueError):
        parse_duration("1:60")
    with pytest.raises(ValueError):
        parse_duration("1:00:60")


def test_parse_rejects_garbage():
    for text in ("", "abc", "10 parsecs", "5h x", "1:2:3:4"):
        with pytest.raises(ValueError):
            parse_duration(text)


def test_format_duration():
    assert format_duration(5400) == "1h 30m"
    assert format_duration(59.9) == "59s"


def test_format_duration_zero():
    assert format_duration(0) == "0s"


def test_format_duration_days():
    assert format_duration(90000) == "1d 1h"
    assert format_duration(3 * 86400 + 5) == "3d 5s"


def test_leap_years():
    assert is_leap_year(2024)
    assert not is_leap_year(2023)
    assert not is_leap_year(1900)


def test_leap_year_divisible_by_400():
    assert is_leap_year(2000)
    assert is_leap_year(1600)


def test_days_in_month():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 12) == 31
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29
    with pytest.raises(ValueError):
        days_in_month(2023, 13)


def test_parse_date():
    assert parse_date("2024-02-29") == (2024, 2, 29)
    with pytest.raises(ValueError):
        parse_date("2023-02-29")
    with pytest.raises(ValueError):
        parse_date("2024/02/01")


def test_day_of_year():
    assert day_of_year(2023, 1, 1) == 1
    assert day_of_year(2023, 3, 1) == 60
    assert day_of_year(2024, 12, 31) == 366


def test_add_days_forward():
    assert add_days((2023, 1, 30), 3) == (2023, 2, 2)
    assert add_days((2023, 12, 31), 1) == (2024, 1, 1)


def test_add_days_backward():
    assert add_days((2024, 3, 1), -1) == (2024, 2, 29)
    assert add_days((2023, 1, 1), -1) == (2022, 12, 31)
