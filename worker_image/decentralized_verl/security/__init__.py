"""Who may talk to a job's workers and whose weights they load: per-job credentials (a certificate for the
job's servers, a job token, the learner's weight-signing key), TLS with the token on every gRPC call
(`transport/secure.py`), and signed weight manifests. See docs/trust.md."""
