"""gRPC channel and server options, set deliberately in one place.

Why each value:
- Message size: a channel sends and accepts up to 64 MiB (gRPC's default receive limit, 4 MiB, is less
  than a batch of long completions); weight transfers stay below it by streaming chunks (a few MiB each).
  A server accepts only what the methods it serves take (`message_limits`: 64 KiB for most methods).
- Keepalive: generation and weight streams can be silent for minutes (a long batch on a slow worker);
  without pings, NATs and load balancers drop idle connections and the caller only notices at its
  deadline. Clients ping every 30 s, and a peer that does not answer within 10 s is declared dead, so
  a killed worker is detected in well under a minute and its work re-dispatched.
- Permit without calls: channels between roles are long-lived and often idle between steps.
- The server accepts pings as often as every 10 s (below the clients' 30 s) so it never answers
  keepalives with GOAWAY "too_many_pings".
- Re-resolution: a replaced pod (a restarted learner, an evicted rollout worker) comes back under the
  same DNS name at a new IP. gRPC re-resolves a name when its connection fails, but by default at most
  every 30 s, so a caller keeps dialing the old address that long and gives up on a peer that is
  already back; 1 s lets it find the new pod at once.
"""

from __future__ import annotations

from collections.abc import Iterable

from decentralized_verl.transport.message_limits import server_limit

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest message either side sends or accepts."""

KEEPALIVE_TIME_MS = 30_000
"""Interval between keepalive pings on an otherwise idle connection."""

KEEPALIVE_TIMEOUT_MS = 10_000
"""How long to wait for a ping's answer before closing the connection as dead."""

MIN_PING_INTERVAL_MS = 10_000
"""The shortest interval between client pings that a server tolerates (must be < KEEPALIVE_TIME_MS)."""

GRPC_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    # 0: keep pinging an idle connection indefinitely (the default stops after 2 pings without data).
    ("grpc.http2.max_pings_without_data", 0),
)
"""Options shared by every channel and server of the project."""

SERVER_ONLY_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
    ("grpc.http2.max_ping_strikes", 0),  # 0: never GOAWAY a client for pinging; the interval bounds it
)
"""Options that only a server understands: how often clients may ping it."""


MIN_RESOLUTION_INTERVAL_MS = 1_000
"""The shortest interval between two DNS resolutions of a channel's target."""

CHANNEL_ONLY_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.dns_min_time_between_resolutions_ms", MIN_RESOLUTION_INTERVAL_MS),
)
"""Options that only a channel understands: how soon it looks a moved peer up again."""


def channel_options() -> list[tuple[str, int]]:
    """Options for `grpc.aio.insecure_channel(address, options=channel_options())` and friends."""
    return [*GRPC_OPTIONS, ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), *CHANNEL_ONLY_OPTIONS]


def server_options(services: Iterable[str] | None = None) -> list[tuple[str, int]]:
    """Options for `grpc.aio.server(options=server_options(...))` of a server of `services` (`Reward`,
    `Health`, ...): it receives no message larger than the largest its methods take, refused by gRPC from
    the length prefix before the body is buffered; every method's largest when `services` is None."""
    receive = ("grpc.max_receive_message_length", server_limit(services))
    return [*GRPC_OPTIONS, receive, *SERVER_ONLY_OPTIONS]
