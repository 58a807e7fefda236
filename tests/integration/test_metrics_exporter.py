"""The learner's training metrics on a Prometheus endpoint: real HTTP scrapes of the exporter, the plan
giving learner rank 0 a `metrics` port (and only in a cluster), the operator's pod exposing it.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from decentralized_verl.serving.metrics_exporter import TrainingMetricsExporter, metric_name


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("dverl_train_") and sample.labels.get("job") == "tiny"
    }


def test_each_steps_numbers_are_served_as_gauges() -> None:
    exporter = TrainingMetricsExporter(0, "tiny", host="127.0.0.1")
    try:
        exporter.observe({"step": 1, "reward_mean": 0.25, "kl": 0.01, "checkpoint": "/x", "ok": True})
        exporter.observe({"step": 2, "reward_mean": 0.5, "entropy": 1.5, "time": 1e9})
        served = _scrape(exporter.port)
        assert served == {
            "dverl_train_step": 2.0,
            "dverl_train_reward_mean": 0.5,
            "dverl_train_kl": 0.01,  # the last value a step reported
            "dverl_train_entropy": 1.5,
        }
        assert metric_name("pg_clip-frac") == "dverl_train_pg_clip_frac"
    finally:
        exporter.close()
