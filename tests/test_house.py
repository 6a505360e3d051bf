"""House rules over src/ that anyone can rerun: comments state rules, not history; no module
over 600 lines.

A comment or docstring names no date, no benchmark step, no issue number and no section of a
document outside the repository ("CONTRACT"): reasons live in docs/decisions/, history in
commit messages (docs/decisions/400-comments-state-rules.md).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "toolkiln"

HISTORY = re.compile(
    r"\b20\d\d-\d\d-\d\d\b"  # a date (JSON Schema's dialect "2020-12" has no day)
    r"|\bsteps? \d+"  # a benchmark step
    r"|\bissues? #?\d+|(?<![\w&])#\d{2,}\b"  # an issue number
    r"|(?-i:\bCONTRACT\b)",  # a section of a document not in the repository
    re.IGNORECASE,
)
# Comments of the non-Python sources: // and /* */ (JavaScript, C, CSS), <!-- --> (HTML),
# ## and <%doc> (Mako).
OTHER_COMMENTS = {
    ".js": re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL),
    ".c": re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL),
    ".h": re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL),
    ".css": re.compile(r"/\*.*?\*/", re.DOTALL),
    ".html": re.compile(r"<!--.*?-->", re.DOTALL),
    ".mako": re.compile(r"^\s*##[^\n]*|<%doc>.*?</%doc>|\"\"\".*?\"\"\"", re.DOTALL | re.M),
}
BUILT = {SRC / "web" / "static" / "app.js"}  # esbuild's bundle of frontend/, not a source


def python_comments(text: str) -> Iterator[tuple[int, str]]:
    """Every comment and docstring of a Python text, with its first line."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                yield body[0].lineno, body[0].value.value


def other_comments(text: str, suffix: str) -> Iterator[tuple[int, str]]:
    for match in OTHER_COMMENTS[suffix].finditer(text):
        yield text.count("\n", 0, match.start()) + 1, match.group()


def comments(path: Path) -> Iterator[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return python_comments(text)
    return other_comments(text, path.suffix)


def history_in(path: Path) -> list[str]:
    """``file:line`` of each comment of ``path`` that names history."""
    return [f"{path.name}:{line}" for line, text in comments(path) if HISTORY.search(text)]


def sources() -> list[Path]:
    suffixes = {".py", *OTHER_COMMENTS}
    return sorted(p for p in SRC.rglob("*") if p.suffix in suffixes and p not in BUILT)


def test_the_scan_finds_history_in_each_kind_of_comment(tmp_path: Path) -> None:
    samples = {
        "a.py": '"""Module (CONTRACT section 3)."""\nx = 1  # until 2026-12-06\n',
        "b.py": 'def f():\n    """As measured in step 45."""\n',
        "c.js": "const a = '2026-12-06';  // see issue #38\n",
        "d.c": "/* docs/benchmarks.md, step 45 */\nint x;\n",
        "e.html": "<!-- CONTRACT 10 -->\n",
    }
    for name, text in samples.items():
        (tmp_path / name).write_text(text)
    found = [hit for path in sorted(tmp_path.iterdir()) for hit in history_in(path)]
    assert found == ["a.py:2", "a.py:1", "b.py:2", "c.js:1", "d.c:1", "e.html:1"]
    # A date in code, a JSON Schema dialect and a CSS colour are no history.
    (tmp_path / "f.py").write_text('"""The 2020-12 dialect."""\nV = "2025-06-18"\n')
    (tmp_path / "g.css").write_text("a { color: #20242a; }\n")
    assert history_in(tmp_path / "f.py") + history_in(tmp_path / "g.css") == []


def test_no_comment_in_src_names_a_date_a_step_an_issue_or_the_contract() -> None:
    assert len(sources()) > 100  # the scan reached the tree
    found = [
        f"{path.parent.relative_to(SRC)}/{hit}" for path in sources() for hit in history_in(path)
    ]
    assert found == []


MAX_LINES = 600


def test_no_module_in_src_is_over_600_lines() -> None:
    """A module past 600 lines holds more than one concept: split it along a real seam."""
    long = {
        str(path.relative_to(SRC)): lines
        for path in sources()
        if (lines := path.read_text(encoding="utf-8").count("\n")) > MAX_LINES
    }
    assert long == {}
