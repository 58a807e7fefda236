"""The Dockerfile read as stages and instructions, for the tests of what the image holds and runs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: dict[str, Stage]

    def chain(self, target: str) -> list[Stage]:
        """The target and the stages it is built FROM, root first (not stages it only COPYs from)."""
        stages = [self.stages[target]]
        while stages[0].base in self.stages:
            stages.insert(0, self.stages[stages[0].base])
        return stages

    def last(self, target: str, keyword: str) -> str | None:
        values = [v for stage in self.chain(target) for v in stage.all(keyword)]
        return values[-1] if values else None

    def runs(self, target: str) -> str:
        return "\n".join(v for stage in self.chain(target) for v in stage.all("RUN"))

    def args(self, target: str) -> dict[str, str]:
        found = {}
        for stage in self.chain(target):
            for rest in stage.all("ARG"):
                name, _, default = rest.partition("=")
                found[name.strip()] = default.strip().strip('"')
        return found


def parse_dockerfile(text: str) -> Dockerfile:
    """Instructions grouped by stage; only the syntax this project's Dockerfile uses."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comments may sit between continuation lines too
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a line continuation"

    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            assert len(words) == 3 and words[1].upper() == "AS", f"every stage must be named: FROM {rest}"
            current = Stage(name=words[2], base=words[0])
            assert current.name not in stages, f"stage {current.name} defined twice"
            stages[current.name] = current
        elif current is None:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = rest.partition("=")
            global_args[name] = default.strip('"')
        else:
            current.instructions.append((keyword, rest))
    return Dockerfile(global_args, stages)
