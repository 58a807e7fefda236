"""The product imports at module level, so its import graph is what its files' heads say.

An import inside a function is allowed only where it says why, on its own line:
`# noqa: PLC0415 <kind>: <reason>`, with a kind from KINDS, and there are fewer than CEILING of them.
ruff's PLC0415 (pyproject.toml) flags an unmarked one for whoever runs `ruff check`; this test holds the
suite to the same rule. The light paths those imports keep light are run for real in
tests/integration/test_imports_in_functions.py.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import tomllib
from pathlib import Path

ROOT = next(p for p in Path(__file__).parents if (p / "pyproject.toml").is_file())  # wherever this file sits
PACKAGES = (ROOT / "worker_image" / "decentralized_verl", ROOT / "operator" / "dverl_operator")
GENERATED = ("_pb2.py", "_pb2_grpc.py")
KINDS = {
    "entry": "a process entry or a command's body: it imports what only that process needs",
    "light": "a heavy package kept off an import path that must stay light (the reason names it)",
    "optional": "a package of an optional extra: the module loads without it",
}
CEILING = 80
NOQA = re.compile(r"noqa: (?P<codes>[A-Z]+[0-9]+(?:, *[A-Z]+[0-9]+)*) *(?P<reason>.*)")


def in_function_imports(source: str) -> list[tuple[int, str]]:
    """(line, comment on that line) of every import whose nearest enclosing scope is a function."""
    comments = {
        token.start[0]: token.string
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                walk(child, True)
            elif isinstance(child, ast.ClassDef):
                walk(child, False)
            elif isinstance(child, ast.Import | ast.ImportFrom):
                if in_function:
                    found.append((child.lineno, comments.get(child.lineno, "")))
            else:
                walk(child, in_function)

    walk(ast.parse(source), False)
    return found


def unexplained(comment: str) -> str | None:
    """Why `comment` does not allow the import on its line, or None when it does."""
    noqa = NOQA.search(comment)
    if noqa is None or "PLC0415" not in noqa["codes"]:
        return "no `# noqa: PLC0415 <kind>: <reason>`"
    kind, colon, why = noqa["reason"].partition(":")
    if not colon or kind not in KINDS:
        return f"the reason must start with one of {sorted(KINDS)} and a colon (got {noqa['reason']!r})"
    if len(why.split()) < 3:
        return f"the reason says too little ({why.strip()!r})"
    return None


def product_sites() -> dict[str, list[tuple[int, str]]]:
    sites = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if path.name.endswith(GENERATED):
                continue
            found = in_function_imports(path.read_text(encoding="utf-8"))
            if found:
                sites[str(path.relative_to(ROOT))] = found
    return sites


def test_every_import_inside_a_function_says_why() -> None:
    problems = [
        f"{path}:{line}: {why}"
        for path, found in product_sites().items()
        for line, comment in found
        if (why := unexplained(comment)) is not None
    ]
    assert problems == [], "move these imports to the module's head, or say why not:\n" + "\n".join(problems)


def test_imports_inside_functions_stay_few() -> None:
    count = sum(len(found) for found in product_sites().values())
    assert 0 < count < CEILING, f"{count} imports inside functions (the ceiling is {CEILING})"


def test_the_check_flags_what_it_should() -> None:
    source = (
        "import os\n"
        "def f():\n"
        "    import json\n"
        "    import csv  # noqa: PLC0415\n"
        "    import re  # noqa: PLC0415 light: re is heavy here, really\n"
        "    import abc  # noqa: PLC0415 fast: because\n"
        "    class C:\n"
        "        import ast  # noqa: PLC0415 entry: the process of this kind\n"
        "class D:\n"
        "    import sys\n"
        "    def g(self):\n"
        "        from os import (  # noqa: PLC0415 optional: the extra, for a job that names it\n"
        "            path,\n"
        "        )\n"
    )
    found = in_function_imports(source)
    assert [line for line, _ in found] == [3, 4, 5, 6, 12]  # class bodies are not functions
    verdicts = [unexplained(comment) for _, comment in found]
    assert [v is None for v in verdicts] == [False, False, True, False, True]
    assert "no `# noqa" in verdicts[0] and "must start with one of" in verdicts[3]


def test_ruff_flags_them_in_the_product_only() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "PLC0415" in lint["select"]
    exempt = [pattern for pattern, codes in lint["per-file-ignores"].items() if "PLC0415" in codes]
    assert not [p for p in exempt if p.startswith(("worker_image", "operator", "*", "**"))], exempt
