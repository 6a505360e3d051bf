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
    cache = CachedAnalyser(inner, entries=16)  # a workspace keeps at most 2
    for code in ("a", "b", "a", "c", "a", "b"):
        cache.analyse("python", code, "ws-1")
    assert [c for _, c, _ in inner.asked] == ["a", "b", "c", "b"]


def test_one_workspace_sending_many_texts_pushes_out_only_its_own() -> None:
    inner = Counting()
    cache = CachedAnalyser(inner, entries=16)  # a workspace keeps at most 2
    cache.analyse("python", "theirs", "ws-other")
    for i in range(50):
        cache.analyse("python", f"mine-{i}", "ws-busy")
    cache.analyse("python", "theirs", "ws-other")
    assert [c for _, c, w in inner.asked if w == "ws-other"] == ["theirs"]
    cache.analyse("python", "mine-49", "ws-busy")
    cache.analyse("python", "mine-0", "ws-busy")
    assert inner.asked[-1] == ("python", "mine-0", "ws-busy")  # its own oldest went
    assert len(inner.asked) == 52
