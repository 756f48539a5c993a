import pytest
from minilib.roman import from_roman, to_roman


def test_to_roman_basic():
    assert to_roman(1) == "I"
    assert to_roman(4) == "IV"
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(2024) == "MMXXIV"


def test_to_roman_nineties():
    assert to_roman(90) == "XC"
    assert to_roman(99) == "XCIX"


def test_to_roman_upper_limit():
    assert to_roman(3999) == "MMMCMXCIX"
    with pytest.raises(ValueError):
        to_roman(4000)
    with pytest.raises(ValueError):
        to_roman(0)


def test_to_roman_type():
    with pytest.raises(TypeError):
        to_roman(3.0)


def test_from_roman_basic():
    assert from_roman("MCMXCIV") == 1994
    assert from_roman("IX") == 9


def test_from_roman_repeated_symbols():
    assert from_roman("III") == 3
    assert from_roman("MMXX") == 2020


def test_from_roman_lowercase():
    assert from_roman("xiv") == 14


def test_from_roman_rejects_non_canonical():
    for numeral in ("IIII", "IC", "VX", "", "ABC"):
        with pytest.raises(ValueError):
            from_roman(numeral)


def test_round_trip():
    for number in (1, 8, 40, 90, 444, 999, 1666, 3999):
        assert from_roman(to_roman(number)) == number
