import pytest
from minilib.roman import from_roman, to_roman


def test_to_roman_basic():
    assert to_roman(1) == "I"
    assert to_roman(4) == "IV"
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(2024) == "MMXXIV"


def test_to_roman_type():
    with pytest.raises(TypeError):
        to_roman(3.0)


def test_from_roman_basic():
    assert from_roman("MCMXCIV") == 1994
    assert from_roman("IX") == 9
