"""The bulk weight plane over real sockets on 127.0.0.1: gRPC BulkOpen for the signed manifest, then raw TCP
(TLS in a secured job) into one buffer per receiver. A chain of 3 receivers gets identical verified weights,
a corrupted, a truncated and a wrong-hash payload are refused with an error naming the peer (nothing is
held), a worker without the bulk plane gets a gRPC push instead, and the same holds with TLS and signatures.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from decentralized_verl.transport.weights import bulk_wire as bw


def test_a_receive_buffer_is_reused_only_once_nothing_views_it() -> None:
    pool = bw.BufferPool()
    first = pool.take(1 << 20)
    held = first[10:20].toreadonly()  # a held version's chunk
    first.release()
    second = pool.take(1 << 20)
    second[:] = b"\xff" * (1 << 20)
    assert bytes(held) == b"\0" * 10 and pool.reused == 0  # the held bytes were not handed out again
    del held
    second.release()
    again = pool.take(1 << 20)
    assert pool.reused == 1 and len(again) == 1 << 20
