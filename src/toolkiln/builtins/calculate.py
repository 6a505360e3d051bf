"""``calculate``: arithmetic, comparisons and math functions over a whitelisted syntax tree.

The expression is parsed by Python's own parser (``ast``) and evaluated by walking only the
node types listed here; there are no names but the listed constants and functions, no
attribute access, no subscripts, no comprehensions, and never ``eval``. Every operation is
bounded so hostile input fails fast with a clear error.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure, BuiltinSpec

MAX_CHARS = 1000
MAX_NODES = 500
MAX_INT_BITS = 4096  # results of integer operations
MAX_FACTORIAL = 1000
MAX_ROUND_DIGITS = 1000  # round(x, n): |n| at most this (10**n is computed for an int x)

Number = int | float

CONSTANTS: dict[str, Number] = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf}


def _factorial(n: Number) -> Number:
    if not isinstance(n, int) or n < 0 or n > MAX_FACTORIAL:
        raise BuiltinFailure(
            "invalid_input", f"factorial takes an integer from 0 to {MAX_FACTORIAL}"
        )
    return math.factorial(n)


def _round(x: Number, ndigits: Number | None = None) -> Number:
    """``round``, with the digits bounded: for an int, Python computes 10**-ndigits, and a
    call with -2*10**7 would hold the service's interpreter for ~19 s, every workspace's
    requests with it (tests/builtins/test_calculate.py)."""
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int) or abs(ndigits) > MAX_ROUND_DIGITS:
        raise _fail(
            f"round takes a whole number of digits from -{MAX_ROUND_DIGITS} to {MAX_ROUND_DIGITS}"
        )
    return round(x, ndigits)


def _lcm(*values: int) -> int:
    """``lcm``, each step's result bounded like any other integer's (many large arguments
    grew it past the bound before the result was checked)."""
    result = 1
    for value in values:
        result = math.lcm(result, value)
        if result.bit_length() > MAX_INT_BITS:
            raise _fail(f"the result has more than {MAX_INT_BITS} bits")
    return result


FUNCTIONS: dict[str, Callable[..., Number]] = {
    "abs": abs, "round": _round, "min": min, "max": max,
    "sqrt": math.sqrt, "cbrt": math.cbrt, "exp": math.exp, "log": math.log,
    "log10": math.log10, "log2": math.log2, "sin": math.sin, "cos": math.cos,
    "tan": math.tan, "asin": math.asin, "acos": math.acos, "atan": math.atan,
    "atan2": math.atan2, "sinh": math.sinh, "cosh": math.cosh, "tanh": math.tanh,
    "floor": math.floor, "ceil": math.ceil, "trunc": math.trunc, "hypot": math.hypot,
    "degrees": math.degrees, "radians": math.radians, "gcd": math.gcd, "lcm": _lcm,
    "factorial": _factorial,
}  # fmt: skip

BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _fail(message: str) -> BuiltinFailure:
    return BuiltinFailure("invalid_input", message, {"field": "expression", "message": message})


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise _fail(f"the result has more than {MAX_INT_BITS} bits")
    return value


def _power(base: Any, exp: Any) -> Any:
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1:
        if exp * abs(base).bit_length() > MAX_INT_BITS + 64:
            raise _fail(f"the result has more than {MAX_INT_BITS} bits")
    return base**exp


class Evaluator(ast.NodeVisitor):
    def __init__(self) -> None:
        self.nodes = 0

    def visit(self, node: ast.AST) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _fail(f"the expression has more than {MAX_NODES} parts")
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is None:
            raise _fail(f"{type(node).__name__} is not allowed in an expression")
        return method(node)

    def visit_Expression(self, node: ast.Expression) -> Any:
        return self.visit(node.body)

    def visit_Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise _fail("only numbers are allowed as literals")
        return _check_size(node.value)

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id in ("true", "false"):
            return node.id == "true"
        if node.id not in CONSTANTS:
            raise _fail(f"unknown name {node.id!r}; constants: {', '.join(sorted(CONSTANTS))}")
        return CONSTANTS[node.id]

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if isinstance(node.op, ast.USub):
            return -value
        if isinstance(node.op, ast.UAdd):
            return +value
        if isinstance(node.op, ast.Not):
            return not value
        raise _fail("that unary operator is not allowed")

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        op = BINARY.get(type(node.op))
        if op is None:
            raise _fail("that operator is not allowed")
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
                raise _fail(f"the result has more than {MAX_INT_BITS} bits")
        return _check_size(op(left, right))

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        values = [self.visit(v) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)

    def visit_Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        for op_node, comparator in zip(node.ops, node.comparators, strict=True):
            op = COMPARE.get(type(op_node))
            if op is None:
                raise _fail("that comparison is not allowed")
            right = self.visit(comparator)
            if not op(left, right):
                return False
            left = right
        return True

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)

    def visit_Call(self, node: ast.Call) -> Any:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
            raise _fail(f"functions: {', '.join(sorted(FUNCTIONS))}")
        args = [self.visit(a) for a in node.args]
        return _check_size(FUNCTIONS[node.func.id](*args))


def evaluate(expression: str) -> Number | bool:
    if len(expression) > MAX_CHARS:
        raise _fail(f"the expression is longer than {MAX_CHARS} characters")
    text = expression.replace("^", "**")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise _fail(f"cannot parse the expression: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise _fail("the expression is nested too deeply") from None
    try:
        result = Evaluator().visit(tree)
    except BuiltinFailure:
        raise
    except ZeroDivisionError:
        raise _fail("division by zero") from None
    except RecursionError:
        raise _fail("the expression is nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise _fail(f"cannot compute: {exc}") from None
    if isinstance(result, float) and math.isnan(result):
        raise _fail("the result is not a number")
    return result


class Calculate:
    spec = BuiltinSpec(
        "calculate",
        "Evaluate an arithmetic expression: + - * / // % ** (or ^), comparisons, and/or/not, "
        "x if c else y, math functions (sqrt, log, sin, round, min, max, factorial, ...) "
        "and the constants pi, e, tau.",
        {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "minLength": 1, "maxLength": MAX_CHARS}
            },
            "required": ["expression"],
            "additionalProperties": False,
        },
    )

    def call(self, payload: dict[str, Any], call: BuiltinCall) -> dict[str, Any]:
        result = evaluate(payload["expression"])
        if isinstance(result, float) and math.isinf(result):
            return {"result": "Infinity" if result > 0 else "-Infinity"}
        return {"result": result}
