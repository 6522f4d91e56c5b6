"""Sizes a family declares once, in a CUDA header, for its kernels and its host code alike.

A header's object-like ``#define NAME expression`` lines (integer expressions over template
constants, launch knobs and shape names such as K) are read here as Python expressions: ``/``
becomes floor division, ``a ? b : c`` a conditional expression, ``&&``/``||`` ``and``/``or``,
and a name another such macro defines is expanded in place. An op module writes its
restrictions with ``expr`` and computes launch sizes with ``value``, so nothing is restated.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from types import CodeType
from typing import Any, Mapping

_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+((?:.*\\\n)*.*)$", re.M)
_NAME = re.compile(r"[A-Za-z_]\w*")


def _top_level(text: str, chars: str) -> list[int]:
    """Positions in ``text`` of the characters ``chars`` outside any parentheses."""
    depth, out = 0, []
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and ch in chars:
            out.append(i)
    return out


def _python(c: str) -> str:
    """The C integer expression ``c`` in Python syntax."""
    c = c.strip()
    marks = _top_level(c, "?:")
    if marks and c[marks[0]] == "?":
        # the ':' that closes the first '?': nested conditionals sit in its branches
        depth = 0
        for pos in marks:
            depth += 1 if c[pos] == "?" else -1
            if depth == 0:
                break
        cond, yes, no = c[:marks[0]], c[marks[0] + 1:pos], c[pos + 1:]
        return f"({_python(yes)} if {_python(cond)} else {_python(no)})"
    out, i = [], 0
    while i < len(c):
        if c[i] == "(":
            close = i + _top_level(c[i:], ")")[0] if _top_level(c[i:], ")") else len(c)
            out.append(f"({_python(c[i + 1:close])})")
            i = close + 1
        else:
            out.append(c[i])
            i += 1
    text = "".join(out)
    text = re.sub(r"(?<![/])/(?![/])", "//", text)
    return text.replace("&&", " and ").replace("||", " or ")


class HeaderSizes:
    """The integer macros of ``paths`` (later files may use the earlier ones' names)."""

    def __init__(self, *paths: Path):
        self.macros: dict[str, str] = {}
        for path in paths:
            text = re.sub(r"//[^\n]*", "", Path(path).read_text())
            for name, body in _DEFINE.findall(text):
                self.macros[name] = body.replace("\\\n", " ").strip()

    @lru_cache(maxsize=None)
    def expr(self, name: str) -> str:
        """Macro ``name`` as a self-contained Python expression (the macros it uses expanded)."""
        if name not in self.macros:
            raise KeyError(f"no #define {name} in the size headers")

        def expand(m: re.Match) -> str:
            word = m.group(0)
            return f"({self.expr(word)})" if word in self.macros else word
        return re.sub(r"\s+", " ", _NAME.sub(expand, _python(self.macros[name])))

    @lru_cache(maxsize=None)
    def _code(self, name: str) -> CodeType:
        return compile(self.expr(name), f"<{name}>", "eval")

    def value(self, name: str, names: Mapping[str, Any]) -> int:
        """Macro ``name`` evaluated at ``names`` (template constants, knobs, shape)."""
        return int(eval(self._code(name), {"__builtins__": {}}, dict(names)))  # noqa: S307
