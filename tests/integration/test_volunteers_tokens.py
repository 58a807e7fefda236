"""Join tokens and deterministic identities: pure functions, hand-checked cases, bad inputs.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import pytest

from decentralized_verl.security import peer_identity as identity

pytestmark = pytest.mark.usefixtures("collected_before_fork")

SECRET = b"0123456789abcdef-job-secret"


def test_identities_are_deterministic_and_match_hivemind(tmp_path) -> None:
    """The peer id computed by hand equals the one p2pd derives from the written key file."""

    from decentralized_verl.volunteers.dht import PeerOptions, start_dht

    seed = identity.random_seed()
    assert identity.peer_id_of_seed(seed) != identity.peer_id_of_seed(identity.random_seed())
    assert identity.coordinator_peer_id(SECRET, "demo") != identity.coordinator_peer_id(SECRET + b"x", "demo")
    assert identity.public_key_of_peer(identity.peer_id_of_seed(seed)) == identity.keypair(seed)[1]
    path = identity.write_identity(seed, tmp_path)
    assert (path.stat().st_mode & 0o777) == 0o600
    dht = start_dht(PeerOptions(host_maddrs=("/ip4/127.0.0.1/tcp/0",), identity_path=str(path)))
    try:
        assert dht.peer_id.to_base58() == identity.peer_id_of_seed(seed)
    finally:
        dht.shutdown()
    peer = identity.peer_id_of_seed(seed)
    assert identity.bootstrap_maddr("10.0.0.5:31337", peer) == f"/ip4/10.0.0.5/tcp/31337/p2p/{peer}"
    assert identity.bootstrap_maddr("dht.ns.svc:31337", peer).startswith("/dns/dht.ns.svc/tcp/31337/p2p/")
    whole = f"/ip4/10.0.0.5/tcp/31337/p2p/{peer}"
    assert identity.bootstrap_maddr(whole, None) == whole
    with pytest.raises(ValueError, match="host:port"):
        identity.bootstrap_maddr("nohost", peer)
    with pytest.raises(ValueError, match="peer id is unknown"):
        identity.bootstrap_maddr("10.0.0.5:31337", None)
    with pytest.raises(ValueError, match="/p2p/"):
        identity.bootstrap_maddr("/ip4/10.0.0.5/tcp/31337", None)
