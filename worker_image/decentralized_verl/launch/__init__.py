"""Executors of a plan on one machine (`dverl run`)."""

from __future__ import annotations

from typing import Any


def run_job(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """`dverl run` as a function; see `decentralized_verl.launch.run.run_job`."""
    from decentralized_verl.launch.run import run_job as _run_job

    return _run_job(*args, **kwargs)
