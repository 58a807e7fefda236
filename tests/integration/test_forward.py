"""The learner's forward (shared prompt per group, logits only at response tokens, trimmed padding) gives
the log-probs, entropies, critic values and gradients of a plain full-sequence forward.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import os

import torch
import torch.multiprocessing as mp

from decentralized_verl.core.forward import (
    response_logprobs,
)
from decentralized_verl.core.samples import TrainBatch, collate
from tests.support.processes import free_port, leave_group
from tests.support.tiny_forward import PAD, grads, grouped_samples, llama, plain_logprobs


class _Scorer(torch.nn.Module):
    """What the trainer wraps in DDP: both passes of the shared forward inside one DDP forward."""

    def __init__(self, model, shared: bool) -> None:
        super().__init__()
        self.model, self.shared = model, shared

    def forward(self, batch: TrainBatch) -> torch.Tensor:
        if self.shared:
            return response_logprobs(self.model, batch)[0]
        return plain_logprobs(self.model, batch)[0]


def _ddp_grads(rank: int, port: int, queue) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    out = {}
    for shared in (True, False):
        model = llama(6)
        ddp = DistributedDataParallel(_Scorer(model, shared))
        batch = collate(grouped_samples(96, (3, 2), seed=10 + rank), PAD)
        ddp(batch).sum().backward()
        out[shared] = grads(model)
    queue.put((rank, out[True].numpy(), out[False].numpy()))
    leave_group(queue)


def test_data_parallel_gradients_equal_the_full_forward() -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_ddp_grads, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = {rank: (shared, plain) for rank, shared, plain in (queue.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    shared0, plain0 = (torch.from_numpy(x) for x in results[0])
    shared1, _ = (torch.from_numpy(x) for x in results[1])
    assert torch.equal(shared0, shared1)  # averaged across ranks
    assert (shared0 - plain0).norm() <= 1e-5 * plain0.norm()
