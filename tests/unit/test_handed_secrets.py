"""The secrets a launcher hands a worker: read from a socket once, the process non-dumpable before it
reads, and a traced process refusing them (whoever traces it would read them as they arrive)."""

from __future__ import annotations

import socket

import pytest

from decentralized_verl.security import handed
from decentralized_verl.security.credentials import CredentialsError


def test_the_tracer_is_read_from_the_status_file() -> None:
    assert handed.tracer_pid("Name:\tpython\nTracerPid:\t4242\nUid:\t0\n") == 4242
    assert handed.tracer_pid("Name:\tpython\nTracerPid:\t0\n") == 0


def test_secrets_are_taken_once_after_the_process_became_undumpable(monkeypatch) -> None:
    monkeypatch.setattr(handed, "_taken", None)
    made = []
    monkeypatch.setattr(handed, "make_undumpable", lambda: made.append(True))
    monkeypatch.setattr(handed, "tracer_pid", lambda status=None: 0)
    ours, theirs = socket.socketpair()
    with ours:
        ours.sendall(b"rollout\ntoken\n\n\n")
    assert handed.take(theirs.detach()) == b"rollout\ntoken\n\n\n"
    assert made == [True]
    assert handed.take(None) == handed.taken() == b"rollout\ntoken\n\n\n"


def test_a_traced_process_refuses_the_secrets(monkeypatch) -> None:
    monkeypatch.setattr(handed, "_taken", None)
    monkeypatch.setattr(handed, "make_undumpable", lambda: None)
    monkeypatch.setattr(handed, "tracer_pid", lambda status=None: 777)
    ours, theirs = socket.socketpair()
    with ours, pytest.raises(CredentialsError, match="process 777 traces this worker"):
        handed.take(theirs.detach())
    assert handed.taken() is None
