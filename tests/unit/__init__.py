"""The fast lane: pure tests. No process, no server (gRPC on loopback included), no sleep, no network
namespace; run first in CI, and where to add a test that can be one."""
