r"""String normalisation of math answers: the cheap checks before (and fallback after) math-verify.

Two levels:
- `light` keeps LaTeX intact for math-verify, fixing only what it misreads: surrounding `$`/`\( \)`,
  thin spaces and `\left`/`\right`, digit grouping (`1,000`, `1\,000`, `1 000` -> `1000`),
  `\dfrac`/`\tfrac` -> `\frac`.
- `canonical` is for plain string comparison: also drops `\text{...}` units after a number, unwraps
  `\text{}`/`\mathrm{}`/`\mathbf{}`, a leading `x =`, `\%`, trailing `.`, whitespace and case.
`plain_number` reads integers, decimals, `a/b`, `\frac{a}{b}` and `\frac12` exactly (Fraction) so the
common arithmetic case needs no sympy at all. A percentage reads as its number: `50\%` = `50`.
"""

from __future__ import annotations

import re
from fractions import Fraction

_DOLLARS = re.compile(r"^\$+(.*?)\$+$", re.DOTALL)
_DELIMS = ((r"\(", r"\)"), (r"\[", r"\]"))
_SPACES = re.compile(r"\\[,;:! ]|~|[\u2009\u202f\u00a0\u2006\u2005]")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?:\.|(?![A-Za-z]))|\\[bB]ig{1,2}[lr]?(?![A-Za-z])")
_GROUPED_INT = re.compile(r"^(-?)(\d{1,3}(?:[, ]\d{3})+)((?:\.\d+)?)$")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac(?![A-Za-z])")
_TEXT_AFTER_NUMBER = re.compile(r"(\d)\s*\\(?:text|mathrm|textrm|mbox)\{[^{}]*\}\s*$")
_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\{([^{}]*)\}")
_LEADING_VAR = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?!.*=)")
_DECIMAL = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)$")
_SLASH = re.compile(r"^(-?\d+)/(-?\d+)$")
_FRAC = re.compile(r"^(-?)\\frac(?:\{(-?\d+)\}\{(-?\d+)\}|(\d)(\d))$")


def light(answer: str) -> str:
    """Normalise delimiters, spacing and digit grouping, keeping the LaTeX math-verify will parse."""
    text = answer.strip()
    while True:
        m = _DOLLARS.match(text)
        if not m:
            break
        text = m.group(1).strip()
    for opener, closer in _DELIMS:
        if text.startswith(opener) and text.endswith(closer):
            text = text[len(opener) : -len(closer)].strip()
    text = _LEFT_RIGHT.sub("", text)
    text = _FRAC_VARIANTS.sub(r"\\frac", text)
    text = _SPACES.sub(" ", text).strip()
    m = _GROUPED_INT.match(text)
    if m:
        text = m.group(1) + m.group(2).replace(",", "").replace(" ", "") + m.group(3)
    return text


def canonical(answer: str) -> str:
    """A form for plain string equality: units, wrappers, `x =`, `%`, case and whitespace removed."""
    text = light(answer)
    text = _TEXT_AFTER_NUMBER.sub(r"\1", text)
    text = _WRAPPERS.sub(r"\1", text)
    text = _LEADING_VAR.sub("", text)
    text = text.replace(r"\%", "").replace("%", "").replace(r"\$", "").replace("^\\circ", "")
    text = text.rstrip(".").strip()
    m = _GROUPED_INT.match(text)
    if m:
        text = m.group(1) + m.group(2).replace(",", "").replace(" ", "") + m.group(3)
    return re.sub(r"\s+", "", text).lower()


def plain_number(answer: str) -> Fraction | None:
    """The exact value of an integer, decimal, `a/b` or `\\frac{a}{b}` answer; None for anything else."""
    text = canonical(answer)
    try:
        if _DECIMAL.match(text):
            return Fraction(text)
        m = _SLASH.match(text)
        if m:
            return Fraction(int(m.group(1)), int(m.group(2)))
        m = _FRAC.match(text)
        if m:
            num, den = (m.group(2), m.group(3)) if m.group(2) is not None else (m.group(4), m.group(5))
            value = Fraction(int(num), int(den))
            return -value if m.group(1) else value
    except (ValueError, ZeroDivisionError):
        return None
    return None


def is_integer_literal(answer: str) -> bool:
    """True for answers that are plainly an integer (after grouping/units), where exact compare decides."""
    return bool(re.fullmatch(r"-?\d+", canonical(answer)))
