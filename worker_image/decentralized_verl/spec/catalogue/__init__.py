"""The catalogue: every name a job spec may use, and what the spec knows about it, kept inside the spec so
that the spec, the CRD and the operator read them without importing the code that implements them.

- `algorithms`: the algorithm presets (what `algorithm.name` means, and what each policy loss implies)
  and the names the algorithm registries serve: advantage estimators, policy losses, loss aggregations,
  KL estimators;
- `rewards`: the built-in reward types;
- `environments`: the built-in environments and the options each takes;
- `backends`: the rollout backends, each a `BackendKind` that says what it can do.

Each registry that implements these names checks itself against its list here as it fills
(`check_registry`): a name registered but not listed, or listed but never registered, stops the import
with a `CatalogueMismatch` that names both sides. So the spec never accepts a name no code serves, and no
code serves a name the spec would refuse.
"""

from __future__ import annotations

from collections.abc import Iterable


class CatalogueMismatch(ValueError):
    """A registry and the catalogue disagree about the names of one kind of thing."""


def check_registry(kind: str, registered: Iterable[str], listed: Iterable[str]) -> None:
    """Raise `CatalogueMismatch` unless `registered` and `listed` hold the same names."""
    have, want = set(registered), set(listed)
    problems = []
    if extra := sorted(have - want):
        problems.append(f"registered but not in the catalogue: {', '.join(extra)}")
    if missing := sorted(want - have):
        problems.append(f"in the catalogue but not registered: {', '.join(missing)}")
    if problems:
        raise CatalogueMismatch(f"{kind} names: {'; '.join(problems)} (spec/catalogue/)")


def check_listed(kind: str, name: str, listed: Iterable[str]) -> None:
    """Raise `CatalogueMismatch` when a registry is about to register a name the catalogue lacks."""
    listed = tuple(listed)
    if name not in listed:
        raise CatalogueMismatch(
            f"{kind} {name!r} is not in the catalogue (spec/catalogue/: {', '.join(listed)})"
        )
