"""The learner's training metrics for Prometheus: every numeric field of each step's record as a gauge
`dverl_train_<field>` on `/metrics` (the learner pod's `metrics` port), so a cluster's dashboards and
alerts see reward, KL, entropy, loss and throughput without reading the run folder."""

from __future__ import annotations

import logging
import re
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, start_http_server

log = logging.getLogger(__name__)
PREFIX = "dverl_train_"


def metric_name(key: str) -> str:
    """A Prometheus metric name for a record field (letters, digits and underscores)."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class TrainingMetricsExporter:
    """Serves the latest step's numbers; `observe` is the training loop's per-step callback."""

    def __init__(self, port: int, job: str, host: str = "0.0.0.0") -> None:
        self.registry = CollectorRegistry()
        self.job = job
        self._gauges: dict[str, Any] = {}
        self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self.server.server_port
        log.info("training metrics for Prometheus on :%d/metrics", self.port)

    def observe(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or key == "time":
                continue
            name = metric_name(key)
            gauge = self._gauges.get(name)
            if gauge is None:
                gauge = Gauge(name, f"the last step's {key}", ["job"], registry=self.registry)
                self._gauges[name] = gauge
            gauge.labels(job=self.job).set(value)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
