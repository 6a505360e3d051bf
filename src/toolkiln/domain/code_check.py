"""Static analysis of tool code: it parses and defines a ``main`` or ``handle`` that returns,
which modules it imports, and (JavaScript) the script form the engine runs.

Python is parsed with :mod:`ast`; JavaScript with tree-sitter's ECMAScript grammar; each text
once. These checks give early, precise errors; they are not a security measure (the sandbox
is). Parsing hostile text can take seconds and hundreds of megabytes, so only a code checker
runs this module (sandbox/checker.py, bounded in time and memory); the service asks for an
``Analysis`` (domain/analysis.py) and never imports it (an import-linter contract).
"""

from __future__ import annotations

import ast
import resource
import warnings
from functools import lru_cache
from typing import Any

import tree_sitter_javascript
from tree_sitter import Language, Node, Parser, Query, QueryCursor

from toolkiln.domain.analysis import ENTRYPOINTS, MAX_MESSAGE_CHARS, Analysis, precheck
from toolkiln.domain.problems import Problem, problem


def analyse(language: str, code: str) -> Analysis:
    """Everything a caller needs from ``code``, from one parse of it."""
    found = precheck(language, code)
    if found:
        return Analysis(tuple(found))
    if language == "python":
        return _analyse_python(code)
    return _analyse_javascript(code)


def _refusal(message: str, line: int | None = None, column: int | None = None) -> Analysis:
    line, column = (p if isinstance(p, int) and p >= 0 else None for p in (line, column))
    return Analysis((problem("code", message[:MAX_MESSAGE_CHARS], line, column),))


# ---------------------------------------------------------------- Python


def _analyse_python(code: str) -> Analysis:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(code, filename="<tool>")
    except SyntaxError as exc:
        return _refusal(f"SyntaxError: {exc.msg}", exc.lineno, exc.offset)
    except (ValueError, RecursionError) as exc:
        return _refusal(f"cannot be parsed: {exc}")
    except MemoryError:
        if _out_of_memory():
            raise  # the checker's memory limit: its host says so (sandbox/checks.py)
        return _refusal("cannot be parsed: it nests too deeply")
    found = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in ENTRYPOINTS
    }
    if not found:
        return _refusal("must define a module-level function named main or handle")
    if len(found) > 1:
        return _refusal("must define only one entrypoint: main or handle, not both")
    fn = next(iter(found.values()))
    out: list[Problem] = []
    if not _py_has_return(fn):
        out.append(problem("code", f"{fn.name}() must contain a return statement", fn.lineno))
    if fn.name == "handle":
        args = fn.args
        positional = len(args.posonlyargs) + len(args.args)
        if positional < 2 and args.vararg is None:
            out.append(problem("code", "handle must take two parameters: (input, ctx)", fn.lineno))
    if out:
        return Analysis(tuple(out))
    return Analysis(
        entrypoint=fn.name, imports=_python_imports(tree), takes_ctx=_py_takes_ctx(tree, fn)
    )


# Names through which code could reach a ``ctx`` its entrypoint is not given (the frames of
# the jail that calls it, ``main`` rebound to a function that declares it) or name it.
_REACHES_CTX = frozenset(
    {
        "ctx", "globals", "locals", "vars", "exec", "eval", "compile", "getattr", "setattr",
        "delattr", "__import__", "__dict__", "__globals__", "__builtins__", "__code__",
        "__wrapped__", "__closure__", "__traceback__", "builtins", "sys", "inspect", "gc",
        "traceback", "_getframe", "f_back", "f_locals", "f_globals", "tb_frame", "gi_frame",
        "cr_frame", "ag_frame",
    }
)  # fmt: skip
_BINDS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.MatchAs, ast.MatchStar)


def _py_takes_ctx(tree: ast.Module, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """False only when the jail never gives the entrypoint ``ctx`` (``main`` without a
    keyword-only ``ctx``, undecorated, bound by its ``def`` alone: jail/pyrunner.py
    ``_call``) and no name or text of the code is one of ``_REACHES_CTX``. A rule for
    speed, not safety: a one-way run that makes a ctx call anyway is given up and sent
    again on the stream (runners/server.py ``OneWayLink``). Guarded by
    tests/runners/test_one_way.py."""
    if fn.name != "main" or fn.decorator_list or any(a.arg == "ctx" for a in fn.args.kwonlyargs):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id in _REACHES_CTX or (node.id == "main" and type(node.ctx) is not ast.Load):
                return True
        elif isinstance(node, ast.Attribute):
            if node.attr in _REACHES_CTX:
                return True
        elif isinstance(node, ast.alias):
            if "main" in (node.name, node.asname) or node.name.split(".")[0] in _REACHES_CTX:
                return True
        elif isinstance(node, ast.Global | ast.Nonlocal):
            if "main" in node.names:
                return True
        elif isinstance(node, _BINDS) or isinstance(node, ast.ExceptHandler):
            if node.name == "main" and node is not fn:
                return True
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str) and "ctx" in node.value:
                return True
            if isinstance(node.value, bytes) and b"ctx" in node.value:
                return True
    return False


def _out_of_memory() -> bool:
    """Whether a MemoryError means memory: CPython's parser raises one, with no message,
    past its nesting limit too, having used next to none (what a real shortage cannot do)."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return limit != resource.RLIM_INFINITY and peak_kib * 1024 * 2 > limit


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


def _python_imports(tree: ast.Module) -> tuple[str, ...]:
    """Top-level module names the code imports anywhere: ``import``/``from`` statements at
    any depth (inside functions, branches, ``try``), and ``importlib.import_module`` or
    ``__import__`` with a literal name (docs/security.md, "Packages")."""
    names: list[str] = []
    for node in ast.walk(tree):
        found: list[str] = []
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = [node.module]
        elif isinstance(node, ast.Call) and node.args and _is_import_call(node.func):
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found = [first.value]
        for name in found:
            top = name.split(".")[0]
            if top and top not in names and len(top) <= 256:
                names.append(top)
    return tuple(names)


def _is_import_call(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in {"__import__", "import_module"}
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


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
# require('name') with one string argument, found by tree-sitter itself (not a walk of every
# node in Python).
_REQUIRE = """
(call_expression
  function: (identifier) @fn
  arguments: (arguments . (string) @name .)
  (#eq? @fn "require"))
"""


@lru_cache(maxsize=1)
def _js() -> tuple[Parser, Query]:
    language = Language(tree_sitter_javascript.language())
    return Parser(language), Query(language, _REQUIRE)


def _analyse_javascript(code: str) -> Analysis:
    parser, requires = _js()
    raw = code.encode("utf-8", "surrogatepass")
    root = parser.parse(raw).root_node
    if root.has_error:
        bad = _first_error(root) or root
        row, col = bad.start_point
        what = f"missing '{bad.type}'" if bad.is_missing else "unexpected token"
        return _refusal(f"SyntaxError: {what}", row + 1, col + 1)
    found = _js_entry_nodes(root)
    if not found:
        return _refusal("must define a top-level function named main or handle")
    if len(found) > 1:
        return _refusal("must define only one entrypoint: main or handle, not both")
    name, fn = next(iter(found.items()))
    if not _js_has_return(fn):
        return _refusal(f"{name}() must contain a return statement", fn.start_point[0] + 1)
    script, names = _script(root, raw)
    for node in QueryCursor(requires).captures(root).get("name", []):
        module = _text(node)[1:-1]
        if module and module not in names and len(module) <= 256:
            names.append(module)
    return Analysis(
        entrypoint=name,
        imports=tuple(names),
        script=script,
        takes_ctx=_js_takes_ctx(root, name, fn),
    )


# Names through which JavaScript could reach the ``ctx`` the jail passes to every entry point
# as its second argument (jail/js/entry.js) without declaring a second parameter.
_JS_REACHES_CTX = frozenset(
    {"ctx", "arguments", "eval", "Function", "caller", "callee", "globalThis", "this"}
)
_JS_NAMES = {
    "identifier",
    "property_identifier",
    "shorthand_property_identifier",
    "shorthand_property_identifier_pattern",
    "this",
}


def _js_takes_ctx(root: Node, name: str, fn: Node) -> bool:
    """False only for a ``main`` with at most one parameter (no rest parameter), named
    ``main`` once in the code (its declaration), where no name is one of
    ``_JS_REACHES_CTX`` and no string holds "ctx". A rule for speed, as in Python
    (``_py_takes_ctx``). Guarded by tests/runners/test_one_way.py."""
    if name != "main":
        return True
    params = fn.child_by_field_name("parameters")
    if params is not None:
        declared = params.named_children
        if len(declared) > 1 or any(p.type == "rest_pattern" for p in declared):
            return True
    mains = 0
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type in _JS_NAMES:
            text = _text(node)
            if text in _JS_REACHES_CTX or node.type == "this":
                return True
            mains += text == "main"
        elif node.type in {"string", "template_string"} and "ctx" in _text(node):
            return True
        stack.extend(node.children)
    return mains != 1


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
                functions = {"arrow_function", "function_expression", "function"}
                if name in ENTRYPOINTS and value is not None and value.type in functions:
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


def _script(root: Node, raw: bytes) -> tuple[str, list[str]]:
    """The code as a script, not a module: ``export`` before a declaration blanked (every
    line and column stays where it was, so error positions still point into the tool's
    code), and each top-level ``import`` rewritten as ``require`` calls on the same line;
    with the module names those imports name."""
    edits: list[tuple[int, int, bytes]] = []
    names: list[str] = []
    for stmt in root.named_children:
        if stmt.type == "export_statement" and stmt.child_by_field_name("declaration") is not None:
            keyword = stmt.children[0]
            if keyword.type == "export":
                width = keyword.end_byte - keyword.start_byte
                edits.append((keyword.start_byte, keyword.end_byte, b" " * width))
        elif stmt.type == "import_statement":
            source = stmt.child_by_field_name("source")
            module = _text(source)[1:-1] if source is not None else ""
            if not module:
                continue
            if module not in names:
                names.append(module)
            edits.append((stmt.start_byte, stmt.end_byte, _required(stmt, module).encode()))
    for start, end, replacement in reversed(edits):
        raw = raw[:start] + replacement + raw[end:]
    return raw.decode("utf-8", "surrogatepass"), names


def _required(stmt: Node, module: str) -> str:
    """One ``import`` statement as ``const`` declarations of ``require(module)``."""
    req = f"require({module!r})"
    clause = next((c for c in stmt.named_children if c.type == "import_clause"), None)
    parts: list[str] = []
    for part in clause.named_children if clause is not None else []:
        if part.type == "identifier":
            parts.append(f"const {_text(part)} = __tk_default({req});")
        elif part.type == "namespace_import":
            ident = next(c for c in part.named_children if c.type == "identifier")
            parts.append(f"const {_text(ident)} = {req};")
        elif part.type == "named_imports":
            pairs = []
            for spec in part.named_children:
                name = _text(spec.child_by_field_name("name"))
                alias = spec.child_by_field_name("alias")
                pairs.append(f"{name}: {_text(alias)}" if alias is not None else name)
            parts.append(f"const {{ {', '.join(pairs)} }} = {req};")
    return " ".join(parts) if parts else f"{req};"
