"""The test suite, in three lanes run in this order (`.ci/run`):

- `unit/`: pure and fast; no process, no server (not even gRPC on loopback), no sleep, no network namespace.
- `integration/`: real processes, servers, DHT peers and namespaces, each test short.
- `e2e/`: jobs that train end to end, the cluster harness, chaos and learning runs.

What tests share lives in `support/` (helpers, the test node, data files) and `conftest.py` (fixtures).
"""
