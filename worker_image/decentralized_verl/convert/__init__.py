"""`dverl convert`: a veRL `ppo_trainer` config (with Hydra overrides), a TRL `GRPOConfig` or an OpenRLHF
command line, as an RLHFJob manifest, with every source field that has no place in it listed and why.

Each importer is a table from the source's field to a spec path (and a value conversion) plus the
fields it knowingly drops with a reason; the tables are the mapping docs/convert.md shows both ways.
Pure: nothing here reads model files or data; the files a veRL config's `defaults:` names come through the
`read` function the command gives.
"""

from __future__ import annotations

from decentralized_verl.convert.common import Conversion, Unmapped
from decentralized_verl.convert.hydra import ReadText
from decentralized_verl.convert.openrlhf import convert_openrlhf
from decentralized_verl.convert.trl import convert_trl
from decentralized_verl.convert.verl import convert_verl

__all__ = ["Conversion", "Unmapped", "convert"]

SOURCES = ("verl", "trl", "openrlhf")


def convert(
    source: str,
    text: str,
    overrides: list[str] | None = None,
    name: str | None = None,
    read: ReadText | None = None,
    where: str = "the config",
) -> Conversion:
    """`text` (a YAML/JSON config, or a shell command line), read from `where`, as a manifest; `read`
    gives the files of its folder by relative path (veRL composes its Hydra defaults from them)."""
    if source == "verl":
        return convert_verl(text, overrides or [], name, read, where)
    if overrides:
        raise ValueError("overrides (key=value) apply to veRL configs only")
    if source == "trl":
        return convert_trl(text, name)
    if source == "openrlhf":
        return convert_openrlhf(text, name)
    raise ValueError(f"unknown source {source!r}; expected {', '.join(SOURCES)}")
