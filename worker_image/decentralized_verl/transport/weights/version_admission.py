"""Which pushed weight version a rollout worker takes: one that follows what it holds and that the
learner publishes now.

A signature says the job's learner made a version at some time, not that it is the learner's current
one: a version from before the learner restarted from an older checkpoint (an earlier epoch of the same
learner, signed by the same key), a replay of an old push, or a version far ahead of the learner's
(v+1,000,000, by whoever got hold of the key) all carry valid signatures. So a relay checks two things
before it receives a byte: the version is newer than the one it holds (a replay is refused), and the
learner itself serves that version with the same bundle digest right now (a `GetManifest` to the
learner, which holds its newest few versions). A version the learner does not publish is refused with a
reason naming it; the worker keeps its weights and pulls the learner's next version as usual, so the
learner never waits on a worker that holds a version it never made.
"""

from __future__ import annotations

import grpc

from decentralized_verl.errors import WireError
from decentralized_verl.proto import dverl_pb2 as pb
from decentralized_verl.proto import dverl_pb2_grpc as pb_grpc
from decentralized_verl.transport import messages as m
from decentralized_verl.transport.rpc_errors import rpc_reason

CONFIRM_TIMEOUT_S = 30.0


def follows_held(manifest: m.WeightManifest, latest: int | None, held_digest: str | None) -> None:
    """Raise WireError unless `manifest` is newer than the `latest` version held (the same version with
    the same digest is fine: it was caught up from the learner before the push arrived)."""
    version = manifest.version
    if latest is None or version > latest:
        return
    if held_digest == manifest.digest:
        return
    raise WireError(
        f"weights v{version}",
        f"not newer than v{latest} held here (a replay of an old version, or another learner's)",
    )


async def confirm_with_learner(manifest: m.WeightManifest, channel: grpc.aio.Channel, learner: str) -> None:
    """Raise WireError unless the learner at `learner` publishes `manifest`'s version with its digest."""
    version = manifest.version
    where = f"weights v{version}"
    try:
        reply = await pb_grpc.WeightsStub(channel).GetManifest(
            pb.ManifestRequest(version=version), timeout=CONFIRM_TIMEOUT_S
        )
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            raise WireError(
                where,
                f"the learner at {learner} does not publish v{version} ({exc.details()}): a version it "
                "never made, or one from before it restarted",
            ) from None
        raise WireError(
            where, f"cannot confirm it with the learner at {learner}: {rpc_reason(exc)}"
        ) from None
    if reply.digest != manifest.digest:
        raise WireError(where, f"differs from the learner's own v{version} (another epoch of the learner)")
