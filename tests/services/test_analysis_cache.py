"""Each text is analysed once per workspace, never shared across workspaces, and an analysis
that did not finish is asked for again."""

from __future__ import annotations

from toolkiln.domain.analysis import Analysis
from toolkiln.services.analysis import CachedAnalyser


class Counting:
    """An analyser that counts what it is asked; texts starting with "slow" run out of time."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str]] = []

    def analyse(self, language: str, code: str, workspace_id: str) -> Analysis:
        self.asked.append((language, code, workspace_id))
        if code.startswith("slow"):
            return Analysis.refused("took longer than 3 s to parse", "time")
        return Analysis(entrypoint="main", imports=(code,))


def test_a_text_is_analysed_once_per_workspace() -> None:
    inner = Counting()
    cache = CachedAnalyser(inner)
    first = cache.analyse("python", "a", "ws-1")
    assert cache.analyse("python", "a", "ws-1") is first
    cache.analyse("python", "a", "ws-2")  # another workspace: its own analysis
    cache.analyse("javascript", "a", "ws-1")  # another language: another text
    assert inner.asked == [
        ("python", "a", "ws-1"),
        ("python", "a", "ws-2"),
        ("javascript", "a", "ws-1"),
    ]


def test_an_analysis_over_a_limit_is_not_kept() -> None:
    inner = Counting()
    cache = CachedAnalyser(inner)
    assert cache.analyse("python", "slow", "ws-1").limit == "time"
    cache.analyse("python", "slow", "ws-1")
    assert len(inner.asked) == 2


def test_the_cache_keeps_the_most_recently_used_within_its_caps() -> None:
    inner = Counting()
    cache = CachedAnalyser(inner, entries=2)
    for code in ("a", "b", "a", "c", "a", "b"):
        cache.analyse("python", code, "ws-1")
    assert [c for _, c, _ in inner.asked] == ["a", "b", "c", "b"]
