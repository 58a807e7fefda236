"""A real small volume (a tmpfs of a given size mounted on a test's folder), for what a full disk does."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def refused() -> str | None:
    """Why this machine cannot mount a tmpfs (not root, no mount permission), or None."""
    import os
    import tempfile

    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    with tempfile.TemporaryDirectory() as probe:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", probe], capture_output=True)
        if done.returncode != 0:
            return f"mount -t tmpfs refused: {done.stderr.decode().strip()}"
        subprocess.run(["umount", probe], check=True)
    return None


@contextmanager
def small_volume(folder: Path, size: str) -> Iterator[Path]:
    """`folder` made a volume of `size` (tmpfs's size syntax: 2m, 64k) for the block's duration."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)
