import pytest
from minilib.intervals import Interval, gaps, merge, total_length


def test_length_and_empty():
    assert Interval(2, 5).length == 3
    assert Interval(3, 3).is_empty()


def test_empty_interval_is_allowed():
    assert Interval(4, 4).length == 0


def test_reversed_interval_rejected():
    with pytest.raises(ValueError):
        Interval(5, 2)


def test_contains_is_half_open():
    interval = Interval(0, 10)
    assert interval.contains(0)
    assert interval.contains(9.99)
    assert not interval.contains(10)


def test_overlaps():
    assert Interval(0, 5).overlaps(Interval(4, 8))
    assert not Interval(0, 5).overlaps(Interval(6, 8))


def test_touching_intervals_do_not_overlap():
    assert not Interval(0, 5).overlaps(Interval(5, 8))
    assert Interval(0, 5).intersection(Interval(5, 8)) is None


def test_intersection():
    assert Interval(0, 5).intersection(Interval(3, 8)) == Interval(3, 5)


def test_shift():
    assert Interval(1, 4).shift(2) == Interval(3, 6)
    assert Interval(1, 4).shift(-1) == Interval(0, 3)


def test_merge_overlapping():
    assert merge([Interval(5, 8), Interval(0, 3), Interval(2, 6)]) == [Interval(0, 8)]


def test_merge_touching():
    assert merge([Interval(0, 2), Interval(2, 4)]) == [Interval(0, 4)]


def test_merge_nested():
    assert merge([Interval(0, 10), Interval(2, 3)]) == [Interval(0, 10)]


def test_merge_disjoint_and_empty():
    assert merge([Interval(4, 5), Interval(0, 1), Interval(2, 2)]) == [Interval(0, 1), Interval(4, 5)]


def test_total_length_counts_overlap_once():
    assert total_length([Interval(0, 4), Interval(2, 6), Interval(10, 11)]) == 7


def test_gaps_inside():
    assert gaps([Interval(2, 4), Interval(6, 7)], Interval(0, 10)) == [
        Interval(0, 2),
        Interval(4, 6),
        Interval(7, 10),
    ]


def test_gaps_trailing_gap():
    assert gaps([Interval(0, 3)], Interval(0, 5)) == [Interval(3, 5)]


def test_gaps_fully_covered_and_outside():
    assert gaps([Interval(-5, 20)], Interval(0, 10)) == []
    assert gaps([Interval(20, 30)], Interval(0, 10)) == [Interval(0, 10)]
