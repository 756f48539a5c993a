import math

import pytest
from minilib.stats import clamp, mean, median, mode, moving_average, normalize, percentile, stdev, variance


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5
    with pytest.raises(ValueError):
        mean([])


def test_median_sorted_input():
    assert median([1, 2, 3]) == 2
    assert median([1, 2, 3, 4]) == 2.5


def test_median_unsorted_input():
    assert median([9, 1, 5]) == 5
    assert median([10, 2, 8, 4]) == 6


def test_mode():
    assert mode([1, 2, 2, 3]) == 2


def test_mode_tie_goes_to_first_seen():
    assert mode([3, 1, 3, 1]) == 3


def test_variance_sample_by_default():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(32 / 7)


def test_variance_population():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        variance([1])


def test_stdev():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == pytest.approx(2.0)
    assert stdev([1, 3]) == pytest.approx(math.sqrt(2))


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 25) == 20


def test_percentile_extremes():
    assert percentile([3, 1, 2], 0) == 1
    assert percentile([3, 1, 2], 100) == 3
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_clamp():
    assert clamp(5, 0, 10) == 5
    assert clamp(-1, 0, 10) == 0
    assert clamp(11, 0, 10) == 10
    with pytest.raises(ValueError):
        clamp(1, 5, 0)


def test_normalize():
    assert normalize([2, 4, 6]) == [0.0, 0.5, 1.0]
    assert normalize([3, 3]) == [0.0, 0.0]


def test_moving_average():
    assert moving_average([1, 2, 3, 4, 5], 2) == [1.5, 2.5, 3.5, 4.5]
    assert moving_average([1, 2, 3, 10], 3) == [2.0, 5.0]


def test_moving_average_window_equal_to_length():
    assert moving_average([2, 4, 6], 3) == [4.0]
    assert moving_average([1], 2) == []
