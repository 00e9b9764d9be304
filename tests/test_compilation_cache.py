"""The shared compilation cache's repair (tests/compilation_cache.py) against JAX's own cache."""

import warnings

from jax._src import lru_cache

from tests import compilation_cache


def _write_fails(cache: lru_cache.LRUCache) -> bool:
    try:
        cache.put("new", b"x" * 10)
    except FileNotFoundError:
        return True
    return not (cache.path / "new-cache").exists()


def test_a_half_written_entry_stops_jax_from_storing_and_repair_removes_it(tmp_path):
    cache = lru_cache.LRUCache(str(tmp_path), max_size=1 << 20)
    for key in ("a", "b", "c"):
        cache.put(key, key.encode() * 100)
    (tmp_path / "b-atime").unlink()  # killed between JAX's two writes of entry b
    (tmp_path / "c-cache").unlink()  # and the other half alone
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _write_fails(cache)  # what froze the suite's cache: every later program compiled again

    assert compilation_cache.repair(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["a-atime", "a-cache"]
    assert cache.get("a") == b"a" * 100
    cache.put("new", b"x" * 10)
    assert cache.get("new") == b"x" * 10
    assert compilation_cache.repair(tmp_path) == 0  # whole entries are kept


def test_repair_of_no_cache_removes_nothing(tmp_path):
    assert compilation_cache.repair(None) == 0
    assert compilation_cache.repair(tmp_path / "absent") == 0
