"""Static checks of tool code on save: it parses and defines a ``main`` or ``handle`` that returns.

Python is parsed with :mod:`ast`; JavaScript with tree-sitter's ECMAScript grammar. These
checks give early, precise errors; they are not a security measure (the sandbox is).
"""

from __future__ import annotations

import ast
import warnings
from functools import lru_cache
from typing import Any

import tree_sitter_javascript
from tree_sitter import Language, Node, Parser

from toolkiln.domain.problems import Problem, problem

ENTRYPOINTS = ("main", "handle")
LANGUAGES = ("python", "javascript")


def check_code(language: str, code: str) -> list[Problem]:
    if language == "python":
        return _check_python(code)
    if language == "javascript":
        return _check_javascript(code)
    return []


def entrypoint_of(language: str, code: str) -> str:
    """Which entrypoint a valid tool defines (``handle`` or ``main``)."""
    names = _python_entrypoints(code) if language == "python" else _js_entrypoints(code)
    return "handle" if "handle" in names else "main"


# ---------------------------------------------------------------- Python


def _python_entrypoints(code: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = ast.parse(code, filename="<tool>")
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in ENTRYPOINTS
    }


def _check_python(code: str) -> list[Problem]:
    try:
        found = _python_entrypoints(code)
    except SyntaxError as exc:
        return [problem("code", f"SyntaxError: {exc.msg}", exc.lineno, exc.offset)]
    except (ValueError, RecursionError, MemoryError) as exc:
        return [problem("code", f"cannot be parsed: {exc}")]
    if not found:
        return [problem("code", "must define a module-level function named main or handle")]
    if len(found) > 1:
        return [problem("code", "must define only one entrypoint: main or handle, not both")]
    fn = next(iter(found.values()))
    out: list[Problem] = []
    if not _py_has_return(fn):
        out.append(problem("code", f"{fn.name}() must contain a return statement", fn.lineno))
    if fn.name == "handle":
        args = fn.args
        positional = len(args.posonlyargs) + len(args.args)
        if positional < 2 and args.vararg is None:
            out.append(problem("code", "handle must take two parameters: (input, ctx)", fn.lineno))
    return out


def _py_has_return(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            return True
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


# ---------------------------------------------------------------- JavaScript

_JS_FUNCTIONS = {"function_declaration", "generator_function_declaration"}
_JS_NESTED_SCOPES = {
    "function_declaration",
    "function_expression",
    "generator_function_declaration",
    "generator_function",
    "arrow_function",
    "method_definition",
    "class_declaration",
    "class",
}


@lru_cache(maxsize=1)
def _js_parser() -> Parser:
    return Parser(Language(tree_sitter_javascript.language()))


def _parse_js(code: str) -> Node:
    return _js_parser().parse(code.encode("utf-8", "surrogatepass")).root_node


def _js_entrypoints(code: str) -> dict[str, Node]:
    return _js_entry_nodes(_parse_js(code))


def _js_entry_nodes(root: Node) -> dict[str, Node]:
    found: dict[str, Node] = {}
    for stmt in root.named_children:
        node = stmt.child_by_field_name("declaration") if stmt.type == "export_statement" else stmt
        if node is None:
            continue
        if node.type in _JS_FUNCTIONS:
            name = _text(node.child_by_field_name("name"))
            if name in ENTRYPOINTS:
                found[name] = node
        elif node.type in {"lexical_declaration", "variable_declaration"}:
            for decl in node.named_children:
                value = decl.child_by_field_name("value")
                name = _text(decl.child_by_field_name("name"))
                if (
                    name in ENTRYPOINTS
                    and value is not None
                    and value.type
                    in {
                        "arrow_function",
                        "function_expression",
                        "function",
                    }
                ):
                    found[name] = value
    return found


def _text(node: Node | None) -> str:
    return node.text.decode("utf-8", "replace") if node is not None and node.text else ""


def _first_error(root: Node) -> Node | None:
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            return node
        if node.has_error:
            stack.extend(reversed(node.children))
    return None


def _check_javascript(code: str) -> list[Problem]:
    root = _parse_js(code)
    if root.has_error:
        bad = _first_error(root) or root
        row, col = bad.start_point
        what = f"missing '{bad.type}'" if bad.is_missing else "unexpected token"
        return [problem("code", f"SyntaxError: {what}", row + 1, col + 1)]
    found = _js_entry_nodes(root)
    if not found:
        return [problem("code", "must define a top-level function named main or handle")]
    if len(found) > 1:
        return [problem("code", "must define only one entrypoint: main or handle, not both")]
    name, fn = next(iter(found.items()))
    if not _js_has_return(fn):
        row = fn.start_point[0] + 1
        return [problem("code", f"{name}() must contain a return statement", row)]
    return []


def _js_has_return(fn: Node) -> bool:
    body = fn.child_by_field_name("body")
    if body is None:
        return False
    if fn.type == "arrow_function" and body.type != "statement_block":
        return True  # an expression body is an implicit return
    stack: list[Any] = list(body.children)
    while stack:
        node = stack.pop()
        if node.type == "return_statement":
            return True
        if node.type in _JS_NESTED_SCOPES:
            continue
        stack.extend(node.children)
    return False


def strip_exports(code: str) -> str:
    """``export function main`` -> ``       function main``: a script, not a module, with every
    line and column where it was (so error positions still point into the tool's code)."""
    root = _parse_js(code)
    raw = bytearray(code.encode("utf-8", "surrogatepass"))
    for stmt in root.named_children:
        if stmt.type == "export_statement" and stmt.child_by_field_name("declaration") is not None:
            keyword = stmt.children[0]
            if keyword.type == "export":
                raw[keyword.start_byte : keyword.end_byte] = b" " * (
                    keyword.end_byte - keyword.start_byte
                )
    return raw.decode("utf-8", "surrogatepass")


def js_requires(code: str) -> tuple[str, list[str]]:
    """Top-level ``import`` statements rewritten as ``require`` calls on the same line, and the
    module names the code imports or requires (string literals only)."""
    root = _parse_js(code)
    raw = code.encode("utf-8", "surrogatepass")
    edits: list[tuple[int, int, bytes]] = []
    names: list[str] = []
    for stmt in root.named_children:
        if stmt.type != "import_statement":
            continue
        source = stmt.child_by_field_name("source")
        module = _text(source)[1:-1] if source is not None else ""
        if not module:
            continue
        if module not in names:
            names.append(module)
        req = f"require({module!r})".encode()
        clause = next((c for c in stmt.named_children if c.type == "import_clause"), None)
        parts: list[str] = []
        if clause is not None:
            for part in clause.named_children:
                if part.type == "identifier":
                    parts.append(f"const {_text(part)} = __tk_default({req.decode()});")
                elif part.type == "namespace_import":
                    ident = next(c for c in part.named_children if c.type == "identifier")
                    parts.append(f"const {_text(ident)} = {req.decode()};")
                elif part.type == "named_imports":
                    pairs = []
                    for spec in part.named_children:
                        name = _text(spec.child_by_field_name("name"))
                        alias = spec.child_by_field_name("alias")
                        pairs.append(f"{name}: {_text(alias)}" if alias is not None else name)
                    parts.append(f"const {{ {', '.join(pairs)} }} = {req.decode()};")
        line = " ".join(parts) if parts else f"{req.decode()};"
        edits.append((stmt.start_byte, stmt.end_byte, line.encode()))
    for start, end, replacement in reversed(edits):
        raw = raw[:start] + replacement + raw[end:]
    code = raw.decode("utf-8", "surrogatepass")
    root = _parse_js(code)
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "call_expression":
            fn = node.child_by_field_name("function")
            args = node.child_by_field_name("arguments")
            if _text(fn) == "require" and args is not None and args.named_child_count == 1:
                arg = args.named_children[0]
                if arg.type == "string":
                    name = _text(arg)[1:-1]
                    if name not in names:
                        names.append(name)
        stack.extend(node.children)
    return code, names
