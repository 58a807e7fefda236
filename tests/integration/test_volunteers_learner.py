"""Two volunteer learners (separate processes) average gradients with hivemind and end each step identical.

Each learner has its own shard of the data; after two steps both hold the parameters of two SGD steps on
the *averaged* gradient, computed here independently in-process as the reference. hivemind's all-reduce
alone leaves peers a few float32 ulps apart (`local + (average - local)`); the learners reconcile after
every step (the group's leader's bytes win), so the two parameter files must be byte-identical. A learner
that stepped on its own gradient differs from the reference by far more than the tolerance, so the test
fails if averaging does not happen.

Here the ones with real processes and servers; the pure checks in tests/unit/; the jobs that train end to
end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = pytest.mark.usefixtures("collected_before_fork")


def test_a_lone_learner_refuses_to_step_when_peers_are_expected() -> None:
    import hivemind
    from hivemind.optim.grad_averager import GradientAverager

    from decentralized_verl.errors import VolunteerError
    from decentralized_verl.volunteers.averaging import average_with_group

    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    averager = None
    try:
        layer = torch.nn.Linear(4, 2)
        layer(torch.ones(1, 4)).sum().backward()
        averager = GradientAverager(
            layer.parameters(),
            dht=dht,
            prefix="lone-learner",
            start=True,
            min_group_size=2,
            target_group_size=2,
            min_matchmaking_time=1.0,
            request_timeout=0.5,
            warn=False,
        )
        averager.accumulate_grads_(1)
        began = time.monotonic()
        with pytest.raises(VolunteerError, match=r"could not average with 2 learners .*step alone"):
            average_with_group(
                averager,
                job="j",
                epoch=0,
                peers=2,
                weight=1,
                round_timeout_s=2.0,
                allreduce_timeout_s=2.0,
                deadline_s=5.0,
            )
        assert time.monotonic() - began < 30
    finally:
        if averager is not None:
            averager.shutdown()
        dht.shutdown()
