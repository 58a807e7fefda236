"""A safe arithmetic evaluator: numbers, + - * / // % ** and parentheses, nothing else.

The expression is parsed with `ast` and walked by hand: names, calls, attributes, subscripts and every
other node are refused, so no text the model writes can reach Python's runtime. Sizes are bounded before
they are computed (expression length, exponent, magnitude), so `9**9**9` is refused, not evaluated.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 10**30
MAX_EXPONENT = 64
MAX_DEPTH = 40


class NotArithmetic(ValueError):
    """The expression is not plain arithmetic, or its value is out of bounds; the message says which."""


_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: lambda a, b: Fraction(a // b),
    ast.Mod: operator.mod,
}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression` (rationals, so 1/3*3 == 1); NotArithmetic naming the problem."""
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if not text:
        raise NotArithmetic("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise NotArithmetic(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        raise NotArithmetic(f"not an arithmetic expression: {text!r}") from None
    return _value(tree.body, 0)


def _bounded(value: Fraction) -> Fraction:
    if abs(value) > MAX_MAGNITUDE:
        raise NotArithmetic(f"result larger than {MAX_MAGNITUDE:.0e}")
    if value.denominator > MAX_MAGNITUDE:
        raise NotArithmetic("result too precise")
    return value


def _value(node: ast.AST, depth: int) -> Fraction:
    if depth > MAX_DEPTH:
        raise NotArithmetic("expression nested too deeply")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise NotArithmetic(f"only numbers are allowed (got {node.value!r})")
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise NotArithmetic("numbers must be finite")
        return _bounded(Fraction(repr(node.value)))  # 0.1 is one tenth, not its binary neighbour
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        inner = _value(node.operand, depth + 1)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, depth + 1), _value(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        fn = _BINARY.get(type(node.op))
        if fn is None:
            raise NotArithmetic(f"operator {type(node.op).__name__} is not allowed")
        if right == 0 and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
            raise NotArithmetic(f"division by zero ({_SYMBOLS[type(node.op)]} 0)")
        return _bounded(fn(left, right))
    raise NotArithmetic(f"{type(node).__name__} is not allowed: only numbers and + - * / // % ** ( )")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise NotArithmetic("only whole-number exponents are allowed")
    if abs(exponent) > MAX_EXPONENT:
        raise NotArithmetic(f"exponent larger than {MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise NotArithmetic("division by zero (0 to a negative power)")
    # |base| ** |exponent| bounded by its logarithm before anything is computed.
    if base != 0 and abs(exponent) * math.log10(max(abs(base), 1 / abs(base))) > 30:
        raise NotArithmetic(f"result larger than {MAX_MAGNITUDE:.0e}")
    return _bounded(base ** int(exponent))


def format_number(value: Fraction) -> str:
    """An integer as itself, anything else as a decimal with up to 10 significant places."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.10g}"
    return text
