from minilib.iterutils import chunked, flatten, group_by, sliding_window, unique


def test_chunked_even():
    assert list(chunked([1, 2, 3, 4], 2)) == [[1, 2], [3, 4]]


def test_sliding_window():
    assert sliding_window([1, 2, 3, 4], 2) == [(1, 2), (2, 3), (3, 4)]
    assert sliding_window([1, 2, 3, 4, 5], 2, step=2) == [(1, 2), (3, 4)]


def test_flatten_lists():
    assert flatten([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]


def test_unique():
    assert unique([3, 1, 3, 2, 1]) == [3, 1, 2]


def test_group_by():
    assert group_by([1, 2, 3, 4, 5], lambda n: n % 2) == {1: [1, 3, 5], 0: [2, 4]}
