"""Seed 000's Python API drives the same runtime (coordinator, trainer, role clients) in-process.

Here the pure checks; the ones with real processes and servers in tests/integration/; the jobs that train
end to end in tests/e2e/, under the same name.
"""

from __future__ import annotations


def test_the_seed_configuration_fields_mean_something_or_are_refused() -> None:
    import pytest

    from decentralized_verl import DecentralizedConfig, NetworkConfig, TrainingConfig
    from decentralized_verl.errors import ManifestError

    peers = DecentralizedConfig(network=NetworkConfig(initial_peers=["/ip4/10.0.0.1/tcp/31337/p2p/Qm"]))
    with pytest.raises(ValueError, match=r"network\.initial_peers: .*dverl-train --initial-peers"):
        peers.job_spec("train.jsonl", 1)
    spec = DecentralizedConfig(training=TrainingConfig(train_batch_size=4, rollout_batch_size=8))
    assert spec.job_spec("train.jsonl", 1).roles.rollout.batch_size == 8
    assert DecentralizedConfig().job_spec("train.jsonl", 1).roles.rollout.batch_size == 8  # = train batch
    with pytest.raises(ManifestError, match=r"roles\.rollout\.batchSize"):
        DecentralizedConfig(training=TrainingConfig(train_batch_size=8, rollout_batch_size=4)).job_spec(
            "train.jsonl", 1
        )
