"""The mapping tables of docs/convert.md, made from the importers' own tables (a test keeps the page equal
to this output, so the docs cannot drift from what `dverl convert` does)."""

from __future__ import annotations

from decentralized_verl.convert import openrlhf_flags, trl, verl_keys

SOURCES = (("veRL", verl_keys), ("TRL GRPOConfig", trl), ("OpenRLHF", openrlhf_flags))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def from_sources() -> str:
    """Each framework's fields: where each goes in the manifest, or why it is left out."""
    parts: list[str] = []
    for title, module in SOURCES:
        prefix = "--" if module is openrlhf_flags else ""
        lines = [f"### {title}", "", "| field | RLHFJob spec | note |", "|---|---|---|"]
        for key, (path, _) in sorted(module.RULES.items()):
            lines.append(f"| `{prefix}{key}` | `{path}` | |")
        for key, where in sorted(module.HANDLED.items()):
            lines.append(f"| `{prefix}{key}` | {_cell(where)} | read together with related fields |")
        for key, why in sorted(module.DROPPED.items()):
            lines.append(f"| `{prefix}{key}` | not mapped | {_cell(why)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def to_sources() -> str:
    """Each spec field: the field of each framework that sets it."""
    paths: dict[str, dict[str, list[str]]] = {}
    for title, module in SOURCES:
        prefix = "--" if module is openrlhf_flags else ""
        for key, (path, _) in module.RULES.items():
            paths.setdefault(path, {}).setdefault(title, []).append(f"`{prefix}{key}`")
    lines = ["| RLHFJob spec | " + " | ".join(t for t, _ in SOURCES) + " |", "|---|---|---|---|"]
    for path in sorted(paths):
        cells = [", ".join(sorted(paths[path].get(title, []))) or "-" for title, _ in SOURCES]
        lines.append(f"| `{path}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def openrlhf_legacy() -> str:
    """OpenRLHF's underscore flags (v0.10.1 and earlier) and the dotted flag each became."""
    lines = ["| flag before v0.10.2 | flag since |", "|---|---|"]
    for old, new in sorted(openrlhf_flags.LEGACY.items()):
        lines.append(f"| `--{old}` | `--{new}` |")
    return "\n".join(lines) + "\n"


TABLES_HEADING = "## The mapping, framework by framework"


def tables_section() -> str:
    """Everything docs/convert.md shows from the tables, from its heading to the page's end. To refresh the
    page after changing a table: `python testing/convert_tables.py` (from the checkout)."""
    return (
        f"{TABLES_HEADING}\n\n{from_sources()}\n### OpenRLHF flags before v0.10.2\n\nOpenRLHF v0.10.1 and "
        "earlier (and `--bf16`, `--prompt_max_len`, `--generate_max_len` from before v0.9) spelled its flags "
        "with underscores; each is read as the dotted flag it became:\n\n"
        f"{openrlhf_legacy()}\n## Each spec field and its sources\n\n{to_sources()}"
    )


if __name__ == "__main__":
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "convert.md"
    text = page.read_text()
    page.write_text(text[: text.index(TABLES_HEADING)] + tables_section())
