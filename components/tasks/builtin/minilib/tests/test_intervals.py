import pytest
from minilib.intervals import Interval, merge


def test_length_and_empty():
    assert Interval(2, 5).length == 3
    assert Interval(3, 3).is_empty()


def test_reversed_interval_rejected():
    with pytest.raises(ValueError):
        Interval(5, 2)


def test_overlaps():
    assert Interval(0, 5).overlaps(Interval(4, 8))
    assert not Interval(0, 5).overlaps(Interval(6, 8))


def test_intersection():
    assert Interval(0, 5).intersection(Interval(3, 8)) == Interval(3, 5)


def test_merge_overlapping():
    assert merge([Interval(5, 8), Interval(0, 3), Interval(2, 6)]) == [Interval(0, 8)]


def test_merge_disjoint_and_empty():
    assert merge([Interval(4, 5), Interval(0, 1), Interval(2, 2)]) == [Interval(0, 1), Interval(4, 5)]
