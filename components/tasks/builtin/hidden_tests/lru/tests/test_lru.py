import pytest
from minilib.lru import LRUCache


def test_put_and_get():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("zzz", "default") == "default"
    assert (cache.hits, cache.misses) == (1, 1)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_evicts_least_recently_inserted():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache
    assert cache.keys() == ["b", "c"]
    assert cache.evictions == 1


def test_get_marks_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.get("a")
    cache.put("c", 3)
    assert "a" in cache
    assert "b" not in cache


def test_update_marks_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.get("a") == 10
    assert "b" not in cache


def test_full_cache_keeps_capacity_items():
    cache = LRUCache(3)
    for index in range(5):
        cache.put(index, index)
    assert len(cache) == 3
    assert cache.keys() == [2, 3, 4]


def test_pop():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.pop("a") == 1
    assert cache.pop("a", None) is None
    with pytest.raises(KeyError):
        cache.pop("a")


def test_resize_shrinks():
    cache = LRUCache(4)
    for key in "abcd":
        cache.put(key, key)
    cache.resize(2)
    assert len(cache) == 2
    assert cache.keys() == ["c", "d"]
    assert cache.evictions == 2
