"""Small C expressions: the custom reduction operators and select predicates of ``Cub``.

The CUDA backend pastes an expression into a CuPy kernel as it is; the CPU
backend evaluates the same text with NumPy. Both accept only this subset of C,
checked by ``parse`` before an op reaches the device:

- the names the op declares (``a`` and ``b`` for a reduction operator, ``x``
  for a predicate), integer literals (decimal or hex, with ``u``/``l``
  suffixes) and floating literals (with an optional ``f`` suffix);
- parentheses, unary ``-`` ``+`` ``!`` ``~``, binary ``*`` ``+`` ``-`` ``<<``
  ``>>`` ``<`` ``<=`` ``>`` ``>=`` ``==`` ``!=`` ``&`` ``^`` ``|`` ``&&``
  ``||`` with C's precedence, and the conditional ``c ? p : q``;
- the calls ``min(p, q)``, ``max(p, q)``, ``fmin(p, q)``, ``fmax(p, q)``
  (on floats these ignore a NaN operand, as CUDA's do), ``abs(p)`` and ``fabs(p)``.

Division and remainder are left out: C truncates where NumPy floors, and
neither is associative. Arithmetic runs in the data's dtype on both backends.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from atomr_accel.core._errors import InvalidArgument

__all__ = ["Expr", "evaluate", "holds", "parse"]

Expr = tuple[Any, ...]
"""A parsed expression: ``("name", n)``, ``("num", v)``, ``("un", op, e)``, ``("bin", op, l,
r)``, ``("if", c, p, q)`` or ``("call", f, args)``."""

_TOKEN = re.compile(r"""\s*(?:
    (?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?|\d+[eE][-+]?\d+[fF]?)
  | (?P<int>0[xX][0-9a-fA-F]+[uUlL]*|\d+[uUlL]*)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op><<|>>|<=|>=|==|!=|&&|\|\||[-+*<>&|^!~?:(),])
)""", re.VERBOSE)

_BINARY: dict[str, int] = {
    "||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6,
    "<": 7, "<=": 7, ">": 7, ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10,
}
_CALLS: dict[str, int] = {"min": 2, "max": 2, "fmin": 2, "fmax": 2, "abs": 1, "fabs": 1}


def _tokens(source: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(source):
        if source[pos:].strip() == "":
            break
        match = _TOKEN.match(source, pos)
        if match is None or match.lastgroup is None:
            raise InvalidArgument(f"cannot read the C expression {source!r} at "
                                  f"{source[pos:].strip()!r}")
        out.append((match.lastgroup, match.group(match.lastgroup)))
        pos = match.end()
    return out


class _Parser:
    """Precedence climbing over the tokens of one expression."""

    def __init__(self, source: str, names: tuple[str, ...]) -> None:
        self.source, self.names = source, names
        self.tokens = _tokens(source)
        self.pos = 0

    def fail(self, what: str) -> InvalidArgument:
        return InvalidArgument(f"the C expression {self.source!r}: {what}")

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.pos >= len(self.tokens):
            raise self.fail("it ends too early")
        token = self.tokens[self.pos]
        if expected is not None and token[1] != expected:
            raise self.fail(f"expected {expected!r}, found {token[1]!r}")
        self.pos += 1
        return token

    def whole(self) -> Expr:
        tree = self.conditional()
        if self.pos != len(self.tokens):
            raise self.fail(f"unexpected {self.peek()!r}")
        return tree

    def conditional(self) -> Expr:
        condition = self.binary(1)
        if self.peek() != "?":
            return condition
        self.take("?")
        chosen = self.conditional()
        self.take(":")
        return ("if", condition, chosen, self.conditional())

    def binary(self, least: int) -> Expr:
        left = self.unary()
        while (op := self.peek()) in _BINARY and _BINARY[op] >= least:
            self.take()
            right = self.binary(_BINARY[op] + 1)
            left = ("bin", op, left, right)
        return left

    def unary(self) -> Expr:
        if self.peek() in ("-", "+", "!", "~"):
            op = self.take()[1]
            return ("un", op, self.unary())
        return self.primary()

    def primary(self) -> Expr:
        kind, text = self.take()
        if text == "(":
            inner = self.conditional()
            self.take(")")
            return inner
        if kind == "float":
            return ("num", float(text.rstrip("fF")))
        if kind == "int":
            return ("num", int(text.rstrip("uUlL"), 0))
        if kind != "name":
            raise self.fail(f"unexpected {text!r}")
        if text in _CALLS:
            self.take("(")
            args = [self.conditional()]
            while self.peek() == ",":
                self.take(",")
                args.append(self.conditional())
            self.take(")")
            if len(args) != _CALLS[text]:
                raise self.fail(f"{text}() takes {_CALLS[text]} argument(s), got {len(args)}")
            return ("call", text, tuple(args))
        if text not in self.names:
            raise self.fail(f"unknown name {text!r}; it may use {', '.join(self.names)}")
        return ("name", text)


def parse(source: object, names: tuple[str, ...]) -> Expr:
    """Parse ``source`` (the subset of C the module docstring lists, over ``names``); raise
    ``InvalidArgument`` naming what does not fit."""
    if not isinstance(source, str) or not source.strip():
        raise InvalidArgument(f"a C expression must be a non-empty str, got {source!r}")
    return _Parser(source, names).whole()


_UNARY: dict[str, Callable[[Any], Any]] = {
    "-": np.negative, "+": np.positive, "!": np.logical_not, "~": np.invert,
}
_BINARY_FN: dict[str, Callable[[Any, Any], Any]] = {
    "||": np.logical_or, "&&": np.logical_and, "|": np.bitwise_or, "^": np.bitwise_xor,
    "&": np.bitwise_and, "==": np.equal, "!=": np.not_equal, "<": np.less,
    "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "<<": np.left_shift,
    ">>": np.right_shift, "+": np.add, "-": np.subtract, "*": np.multiply,
}
_CALL_FN: dict[str, Callable[..., Any]] = {
    "min": np.fmin, "max": np.fmax, "fmin": np.fmin, "fmax": np.fmax, "abs": np.abs,
    "fabs": np.abs,
}


def evaluate(tree: Expr, env: Mapping[str, Any], dtype: np.dtype[Any]) -> Any:
    """Evaluate a parsed expression with NumPy over the arrays in ``env``; the result is cast
    to ``dtype`` (a comparison's True is 1, as in C)."""
    return np.asarray(_eval(tree, env, dtype)).astype(dtype, copy=False)


def holds(tree: Expr, env: Mapping[str, Any], dtype: np.dtype[Any]) -> Any:
    """Evaluate a parsed predicate with NumPy: a bool array, true where the value is non-zero
    (as C tests a condition); literals take ``dtype`` as in ``evaluate``."""
    return np.asarray(_eval(tree, env, dtype)) != 0


def _eval(tree: Expr, env: Mapping[str, Any], dtype: np.dtype[Any]) -> Any:
    kind = tree[0]
    if kind == "name":
        return env[tree[1]]
    if kind == "num":
        value = tree[1]
        if isinstance(value, int) and dtype.kind in "iu":
            return np.array(value).astype(dtype)  # wraps as C's conversion does
        return value
    if kind == "un":
        return _UNARY[tree[1]](_eval(tree[2], env, dtype))
    if kind == "bin":
        return _BINARY_FN[tree[1]](_eval(tree[2], env, dtype), _eval(tree[3], env, dtype))
    if kind == "if":
        return np.where(_eval(tree[1], env, dtype), _eval(tree[2], env, dtype),
                        _eval(tree[3], env, dtype))
    return _CALL_FN[tree[1]](*(_eval(arg, env, dtype) for arg in tree[2]))
