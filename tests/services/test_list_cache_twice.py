"""A list put again under a key the workspace already holds (two requests that missed
at once and both rendered it) stays held, and the cache's counts stay true
(services/tool_lists.py, ``ListCache.put``)."""

from __future__ import annotations

from toolkiln.services.tool_lists import SHARE, Key, ListCache, Listing


def key(agent: str) -> Key:
    return (agent, "openai", False, "direct", "python", "id")


def listing(workspace: str) -> Listing:
    return Listing.of(workspace, [{"name": "t"}])


def test_a_list_rendered_twice_at_once_is_held_and_counted_once() -> None:
    cache = ListCache()
    cache.put("wa", 1, key("a1"), listing("wa"))
    cache.put("wa", 1, key("a1"), listing("wa"))  # the second of two concurrent misses
    assert cache.get("wa", 1, key("a1")) is not None
    assert cache.entries == 1


def test_lists_rendered_twice_leave_no_counts_that_push_out_other_workspaces() -> None:
    cache = ListCache(max_entries=2 * SHARE)
    for i in range(3 * SHARE):  # each workspace's one list, rendered by two requests at once
        cache.put(f"w{i}", 1, key("a"), listing(f"w{i}"))
        cache.put(f"w{i}", 1, key("a"), listing(f"w{i}"))
    cache.put("quiet", 1, key("q"), listing("quiet"))
    assert cache.get("quiet", 1, key("q")) is not None  # evicted at once: counts of nothing


def test_a_list_rendered_twice_never_fails_a_later_put() -> None:
    small, big = listing("w"), Listing.of("w", [{"name": "y" * 200}])
    cache = ListCache(max_bytes=big.weight * SHARE + small.weight)
    for i in range(SHARE + 1):  # ValueError (a 500): max() of no workspaces
        cache.put(f"w{i}", 1, key("a"), small)
        cache.put(f"w{i}", 1, key("a"), big)
