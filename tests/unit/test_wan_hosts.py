"""Hosts on emulated links (testing/netlab): each process in its own network namespace with its
own address, links shaped by tc tbf (bandwidth) and the userspace link relay (latency, jitter, loss), and
partitions that cut a host off and bring it back. Skipped with the reason where namespaces are refused.

The link checks assert lower bounds only (a delayed link can never be faster than its delay; a load on
the machine only makes things slower), so they hold on a busy 2-core machine.

Here the pure checks; the ones with real processes and servers in tests/integration/; the jobs that train
end to end in tests/e2e/, under the same name.
"""

from __future__ import annotations

import pytest
from netlab.profiles import PROFILES, LinkProfile, ProfileError, profile, tbf_args


# ------------------------------------------------------------------------------------- profiles
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rate_mbit": 0}, "rate_mbit"),
        ({"rate_mbit": -5}, "rate_mbit"),
        ({"rtt_ms": -1}, "rtt_ms"),
        ({"rtt_ms": 10, "jitter_ms": 6}, "jitter_ms"),
        ({"loss": 1.0}, "loss"),
        ({"loss": -0.1}, "loss"),
    ],
)
def test_bad_link_profiles_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ProfileError, match=field):
        LinkProfile("bad", **kwargs)


def test_profiles_and_token_bucket() -> None:
    assert not profile("lan").needs_relay and profile("home20").needs_relay
    assert profile("home20").one_way_delays() == (0.075, 0.005)
    assert PROFILES["home100"].rate_mbit == 100
    with pytest.raises(ProfileError, match="expected one of"):
        profile("dialup")
    args = tbf_args(20)
    assert args[:3] == ["tbf", "rate", "20mbit"]
    burst, limit = int(args[args.index("burst") + 1]), int(args[args.index("limit") + 1])
    assert burst >= 3000 and limit == 250_000  # 100 ms of 20 Mbit/s
