"""Task watchers per key and the permits a connection holds: taken together from the process's budget and the
key's, or not at all."""

from __future__ import annotations

import pytest

from gateway.errors import OverloadedError
from gateway.keys.model import ApiKey
from gateway.keys.resolver import ANONYMOUS
from gateway.keys.watchers import KeyWatchers, TooManyWatchersError, WatcherPermits
from gateway.limits import watcher_limit


def key(name: str) -> ApiKey:
    return ApiKey(id=f"key_{name}", secret_hash="", prefix=f"sk-…{name}", name=name, team="default")


def test_each_key_has_its_own_count_and_the_anonymous_caller_none() -> None:
    watchers = KeyWatchers(2)
    watchers.take(key("a"), 2)
    with pytest.raises(TooManyWatchersError, match="limit is 2") as refused:
        watchers.take(key("a"))
    assert refused.value.status_code == 429 and refused.value.headers["Retry-After"] == "5"
    watchers.take(key("b"))
    watchers.give_back(key("a"))
    watchers.take(key("a"))
    watchers.take(ANONYMOUS, 100)  # a gateway without keys: the process budget bounds everyone
    assert (watchers.held(key("a")), watchers.held(key("b")), watchers.held(ANONYMOUS)) == (2, 1, 0)


def test_permits_grow_and_shrink_and_a_refusal_takes_nothing() -> None:
    process, keys = watcher_limit(5), KeyWatchers(3)
    permits = WatcherPermits(process, keys, key("a"))
    permits.hold(2)
    assert (process.count, keys.held(key("a")), permits.held) == (2, 2, 2)
    with pytest.raises(TooManyWatchersError):
        permits.hold(4)  # the key's limit
    assert (process.count, keys.held(key("a")), permits.held) == (2, 2, 2)
    other = WatcherPermits(process, KeyWatchers(10), key("b"))
    other.hold(3)
    with pytest.raises(OverloadedError, match="5 task watchers"):
        permits.hold(3)  # the process's budget
    assert (process.count, keys.held(key("a")), permits.held) == (5, 2, 2)
    permits.hold(1)
    other.release()
    permits.release()
    assert (process.count, keys.held(key("a")), permits.held, other.held) == (0, 0, 0, 0)


def test_permits_without_the_process_budget_count_the_keys_alone() -> None:
    keys = KeyWatchers(1)
    permits = WatcherPermits(None, keys, key("a"))  # an event stream: its process permit is the middleware's
    permits.hold(1)
    with pytest.raises(TooManyWatchersError):
        WatcherPermits(None, keys, key("a")).hold(1)
    permits.release()
    assert (keys.held(key("a")), permits.held) == (0, 0)
