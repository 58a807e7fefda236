"""Regenerate the checked-in protobuf / gRPC Python modules from proto/.

Run `python -m decentralized_verl.proto.generate` from a source checkout after editing a .proto file.
The generated files are committed (so the worker and operator images need no protoc), and
tests/unit/test_proto.py regenerates into a temporary folder and fails when they differ.

The .proto files live at proto/decentralized_verl/proto/*.proto and protoc runs with `-I proto`, so the
generated modules import each other as `decentralized_verl.proto.<name>_pb2`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc  # grpcio-tools, a dev dependency: this module is a source checkout's tool

PACKAGE_DIR = Path(__file__).resolve().parent
"""Where the generated modules live (this package)."""

PACKAGE_SUBPATH = Path("decentralized_verl") / "proto"
"""The .proto files' folder below the proto root; mirrors the import path."""

GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")
"""Every file protoc writes for one .proto (messages, services, type stubs)."""


class GenerateError(RuntimeError):
    """protoc failed or the proto sources cannot be found."""


def default_proto_root() -> Path:
    """The repository's proto/ folder, found from this file's place in a source checkout."""
    # worker_image/decentralized_verl/proto/generate.py -> repository root is three folders up.
    return PACKAGE_DIR.parents[2] / "proto"


def proto_files(proto_root: Path) -> list[Path]:
    """The .proto sources, sorted so generation order (and output) is stable."""
    files = sorted((proto_root / PACKAGE_SUBPATH).glob("*.proto"))
    if not files:
        raise GenerateError(f"no .proto files under {proto_root / PACKAGE_SUBPATH}")
    return files


def generated_files(directory: Path) -> list[Path]:
    """The generated modules present in a folder."""
    return sorted(p for p in directory.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def generate(out_dir: Path, proto_root: Path | None = None) -> list[Path]:
    """Run grpc_tools.protoc on every .proto and write the modules flat into out_dir.

    Stale generated files in out_dir (from a removed .proto) are deleted so the folder matches exactly.
    Returns the written paths.
    """
    root = (proto_root or default_proto_root()).resolve()
    sources = proto_files(root)
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(s.relative_to(root)) for s in sources),
        ]
        # protoc resolves the relative source names against the -I roots.
        code = protoc.main(args)
        if code != 0:
            raise GenerateError(f"protoc exited with {code}: {' '.join(args)}")
        produced = generated_files(Path(tmp) / PACKAGE_SUBPATH)
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in generated_files(out_dir):
            if stale.name not in {p.name for p in produced}:
                stale.unlink()
        written = []
        for src in produced:
            dst = out_dir / src.name
            shutil.copyfile(src, dst)
            written.append(dst)
    return written


def main(argv: list[str] | None = None) -> int:
    """CLI: regenerate into this package (or --out) from the checkout's proto/ (or --proto-root)."""
    parser = argparse.ArgumentParser(prog="python -m decentralized_verl.proto.generate", description=__doc__)
    parser.add_argument(
        "--proto-root", type=Path, default=None, help="folder holding decentralized_verl/proto/*.proto"
    )
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR, help="where to write the modules")
    args = parser.parse_args(argv)
    try:
        written = generate(args.out, args.proto_root)
    except GenerateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
