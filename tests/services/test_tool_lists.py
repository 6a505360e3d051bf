"""The rendered-list cache's own rules: a list is found under its workspace and version only,
a newer version drops the workspace's older lists, and past its bounds a workspace's lists
push out its own before another's (services/tool_lists.py)."""

from __future__ import annotations

from toolkiln.services.tool_lists import SHARE, Key, ListCache, Listing


def key(agent: str, fmt: str = "openai") -> Key:
    return (agent, fmt, False, "direct", "python", "id")


def listing(workspace: str, text: str = "x") -> Listing:
    return Listing.of(workspace, [{"name": text}])


def test_a_list_is_found_under_its_own_workspace_and_version_only() -> None:
    cache = ListCache()
    cache.put("wa", 3, key("a1"), listing("wa"))
    assert cache.get("wa", 3, key("a1")) is not None
    assert cache.get("wb", 3, key("a1")) is None  # another workspace's key
    assert cache.get("wa", 3, key("a1", "mcp")) is None
    assert cache.get("wa", 4, key("a1")) is None  # moved on: dropped
    assert cache.get("wa", 3, key("a1")) is None and cache.entries == 0


def test_a_list_rendered_at_an_older_version_is_not_kept() -> None:
    cache = ListCache()
    cache.put("wa", 5, key("a1"), listing("wa", "new"))
    cache.put("wa", 4, key("a2"), listing("wa", "old"))  # a slow request's
    assert cache.get("wa", 5, key("a2")) is None
    found = cache.get("wa", 5, key("a1"))
    assert found is not None and found.entries == [{"name": "new"}]


def test_one_workspace_cannot_push_out_anothers_lists() -> None:
    cache = ListCache(max_entries=8 * SHARE)
    cache.put("quiet", 1, key("q"), listing("quiet"))
    for i in range(100):
        cache.put("busy", 1, key(f"b{i}"), listing("busy"))
    assert cache.get("quiet", 1, key("q")) is not None
    assert cache.entries == 8 + 1  # the busy one holds its share, the newest of its lists
    assert cache.get("busy", 1, key("b99")) is not None
    assert cache.get("busy", 1, key("b0")) is None


def test_the_bytes_bound_holds() -> None:
    one = listing("w", "y" * 1000).weight
    cache = ListCache(max_bytes=SHARE * 3 * one)
    for ws in range(10):
        for i in range(5):
            cache.put(f"w{ws}", 1, key(f"a{i}"), listing(f"w{ws}", "y" * 1000))
    assert cache.bytes <= SHARE * 3 * one
    assert cache.bytes == sum(listing("w", "y" * 1000).weight for _ in range(cache.entries))
    too_big = ListCache(max_bytes=one)  # more than a workspace's share: rendered, not kept
    too_big.put("w", 1, key("a"), listing("w", "y" * 1000))
    assert too_big.entries == 0 and too_big.renders == 1
