"""Fixtures the lanes share (a fixture used by one lane only lives in that lane's conftest.py)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.dockerfile import Dockerfile, parse_dockerfile
from tests.support.paths import ROOT
from tests.support.ray_head import SESSION_AUTH, ray_head

os.environ.update(SESSION_AUTH)  # before any test module loads Ray (tests/support/ray_head.py)


@pytest.fixture
def collected_before_fork() -> Iterator[None]:
    """hivemind starts its DHT and averagers as forked processes. Garbage left by earlier tests (gRPC
    channels and servers, finished compute work) would otherwise be inherited and collected in the child,
    where destroying objects whose threads stayed in the parent can abort it; collect it here first."""
    gc.collect()
    yield


@pytest.fixture(scope="module")
def policy(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    """A tiny Llama and its tokenizer, built from a config (no hub) by the test module's own `TINY` spec,
    once a module."""
    from decentralized_verl.models.loading import load_model_and_tokenizer
    from decentralized_verl.spec import ModelSpec

    return load_model_and_tokenizer(ModelSpec(tiny=request.module.TINY))


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    """The checkout's Dockerfile, read into stages."""
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Ray head for the module (tests/support/ray_head.py); its address."""
    with ray_head(tmp_path_factory.mktemp("ray")) as head:
        yield head
