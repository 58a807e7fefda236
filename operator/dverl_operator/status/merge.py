"""Pure: the JSON merge patch that writes a job's new `.status` over the old one.

The operator is the only writer of `.status`, and it writes only what changed, so an unchanged job costs no
write and no watch event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch turning `old` into `new` (None deletes a key); {} when equal."""
    old = old or {}
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = value
    return patch
