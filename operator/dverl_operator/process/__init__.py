"""The operator process around kopf: leader election on a Lease (only the holder reconciles), the /healthz
verdict, and the Prometheus metrics with the small HTTP server that answers both."""
