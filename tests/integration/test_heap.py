"""Freed tensor memory stays in the process: a training-like loop stops faulting its pages in again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, resource, sys, threading
import torch
torch.set_num_threads(1)
applied = None
if sys.argv[1] == "keep":
    from decentralized_verl.runtime.heap import keep_freed_memory
    applied = keep_freed_memory()
    assert keep_freed_memory() == applied  # idempotent
layer = torch.nn.Linear(256, 4096)
faults = []
def steps():
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = layer(torch.randn(4096, 256))  # a 64 MiB activation and its gradient
        out.logsumexp(-1).sum().backward()
        layer.weight.grad = layer.bias.grad = None
        del out
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
thread = threading.Thread(target=steps)  # a worker thread, as the learner's update runs in
thread.start(); thread.join()
print(json.dumps({"applied": applied, "faults": faults}))
"""


def probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_a_training_loop_stops_faulting_pages_in_with_the_setting() -> None:
    activation_pages = 64 * 2**20 // 4096
    plain, kept = probe("plain"), probe("keep")
    assert kept["applied"] is True
    assert min(plain["faults"][2:]) > activation_pages  # every step maps its big tensors afresh
    assert min(kept["faults"][2:]) < activation_pages // 4  # steady state: the heap's blocks are reused
    assert sum(kept["faults"][2:]) < sum(plain["faults"][2:]) / 3
