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


def test_pop():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.pop("a") == 1
    assert cache.pop("a", None) is None
    with pytest.raises(KeyError):
        cache.pop("a")
