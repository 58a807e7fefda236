"""Link profiles: what a host's connection to the rest of the job looks like.

Bandwidth is enforced by the kernel (tc `tbf` on the host's link, both directions); latency, jitter and
loss by the userspace link relay (`link_relay`), because the kernels these tests run on have no
`netem`. A profile with no latency, jitter or loss needs no relay: the host sits on the bridge directly.
"""

from __future__ import annotations

from dataclasses import dataclass


class ProfileError(ValueError):
    """A link profile that cannot be applied; the message names the field."""


@dataclass(frozen=True)
class LinkProfile:
    """One host's link. `rtt_ms` is the round trip added between this host and every other one
    (half each way); `jitter_ms` varies each packet's delay (packets keep their order, like a real
    path without reordering); `loss` drops each packet, each direction, with this probability."""

    name: str = "lan"
    rate_mbit: float | None = None
    rtt_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise ProfileError(f"link {self.name!r}: rate_mbit must be > 0 (got {self.rate_mbit})")
        if self.rtt_ms < 0 or self.jitter_ms < 0:
            raise ProfileError(f"link {self.name!r}: rtt_ms and jitter_ms must be >= 0")
        if self.jitter_ms > self.rtt_ms / 2:
            raise ProfileError(f"link {self.name!r}: jitter_ms ({self.jitter_ms}) must be <= rtt_ms / 2")
        if not 0.0 <= self.loss < 1.0:
            raise ProfileError(f"link {self.name!r}: loss must be in [0, 1) (got {self.loss})")

    @property
    def needs_relay(self) -> bool:
        return self.rtt_ms > 0 or self.jitter_ms > 0 or self.loss > 0

    def one_way_delays(self) -> tuple[float, float]:
        """(base, jitter) one-way delay in seconds."""
        return self.rtt_ms / 2000.0, self.jitter_ms / 1000.0


def tbf_args(rate_mbit: float, mtu: int = 1500) -> list[str]:
    """tc arguments of a token bucket at `rate_mbit`: a burst of a few milliseconds' worth of bytes
    (never under two packets) and a queue of ~100 ms, so the link drains at the rate without dropping
    the bursts TCP sends at the start of a window."""
    if not rate_mbit > 0:
        raise ProfileError(f"rate_mbit must be > 0 (got {rate_mbit})")
    bytes_per_s = rate_mbit * 1e6 / 8
    burst = max(2 * mtu, int(bytes_per_s * 0.004))
    limit = max(4 * mtu, int(bytes_per_s * 0.1))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "limit", str(limit)]


PROFILES: dict[str, LinkProfile] = {
    "lan": LinkProfile("lan"),
    "home100": LinkProfile("home100", rate_mbit=100, rtt_ms=40, jitter_ms=2),
    "home20": LinkProfile("home20", rate_mbit=20, rtt_ms=150, jitter_ms=5, loss=0.01),
}
"""The profiles the WAN benchmark and the network chaos faults use, by name."""


def profile(name: str) -> LinkProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ProfileError(f"link profile {name!r}: expected one of {sorted(PROFILES)}") from None
