"""Kubernetes resource quantities, added up: a gang's minimum resources are the sum of its members'
requests. Pure; only the suffixes the spec accepts (roles.Resources: m, k..E, Ki..Ei)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal

_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
_BINARY = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")


def parse(text: str) -> Decimal:
    """The quantity's value in base units (cores, bytes); ValueError naming the text otherwise."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]


def render_cpu(cores: Decimal) -> str:
    """Whole cores as `4`, anything finer in millicores (`2500m`), as kubectl writes them."""
    if cores == cores.to_integral_value():
        return str(int(cores))
    return f"{int((cores * 1000).to_integral_value())}m"


def render_bytes(amount: Decimal) -> str:
    """The largest binary suffix that divides the amount exactly (`48Gi`), else plain bytes."""
    whole = int(amount.to_integral_value())
    for suffix in _BINARY:
        unit = int(_SUFFIX[suffix])
        if whole and whole % unit == 0:
            return f"{whole // unit}{suffix}"
    return str(whole)


def total(texts: Iterable[str | None]) -> Decimal:
    return sum((parse(t) for t in texts if t), Decimal(0))
