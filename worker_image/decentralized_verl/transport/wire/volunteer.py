"""Volunteer admission, heartbeats, and worker readiness."""

from __future__ import annotations

from dataclasses import dataclass

from decentralized_verl.transport.wire.common import (
    ROLES,
    WireError,
    _check_finite,
    _check_nonempty_text,
    _role,
    pb,
)


@dataclass(frozen=True)
class JoinRequest:
    """A volunteer asking to serve a role in a job."""

    job: str
    token: str
    role: str
    hardware: str
    tokens_per_second: float

    def __repr__(self) -> str:  # the token is a credential: keep it out of logs
        return (
            f"JoinRequest(job={self.job!r}, token='***', role={self.role!r}, "
            f"hardware={self.hardware!r}, tokens_per_second={self.tokens_per_second!r})"
        )


@dataclass(frozen=True)
class JoinReply:
    """The coordinator's decision on a join request."""

    accepted: bool
    peer_id: str = ""
    reason: str = ""
    policy_version: int = 0
    weights_address: str = ""
    weights_verify_key: bytes = b""
    """The job's public key for weight manifests (empty: the job does not sign its weights)."""


@dataclass(frozen=True)
class Heartbeat:
    """A joined volunteer's sign of life."""

    peer_id: str
    policy_version: int
    load: float


@dataclass(frozen=True)
class Readiness:
    """Whether a worker can take work."""

    ready: bool
    role: str
    worker_id: str
    device: str = ""
    """Where its model computes (`cpu`, `cuda:0`); empty from a worker that does not say."""
    device_memory_allocated: int = 0
    """Bytes its tensors hold on its GPU, read by the worker itself (the GPU check's proof)."""


def join_request_to_proto(j: JoinRequest) -> pb.JoinRequest:
    return pb.JoinRequest(
        job=j.job,
        token=j.token,
        role=ROLES[j.role],
        hardware=j.hardware,
        tokens_per_second=j.tokens_per_second,
    )


def join_request_from_proto(msg: pb.JoinRequest) -> JoinRequest:
    """Validate a join request's shape (the token's signature is checked by the trust layer)."""
    _check_nonempty_text(msg.job, "job")
    _check_nonempty_text(msg.token, "token")
    role = _role(msg.role, "role")
    _check_finite(msg.tokens_per_second, "tokens_per_second", minimum=0.0)
    return JoinRequest(msg.job, msg.token, role, msg.hardware, msg.tokens_per_second)


def join_reply_to_proto(r: JoinReply) -> pb.JoinReply:
    return pb.JoinReply(
        accepted=r.accepted,
        peer_id=r.peer_id,
        reason=r.reason,
        policy_version=r.policy_version,
        weights_address=r.weights_address,
        weights_verify_key=r.weights_verify_key,
    )


def join_reply_from_proto(msg: pb.JoinReply) -> JoinReply:
    """Validate a join reply: an accepted volunteer needs a peer id and a weights address."""
    if msg.accepted:
        _check_nonempty_text(msg.peer_id, "peer_id")
        _check_nonempty_text(msg.weights_address, "weights_address")
    else:
        _check_nonempty_text(msg.reason, "reason")
    if msg.weights_verify_key and len(msg.weights_verify_key) != 32:
        raise WireError(
            "weights_verify_key", f"an Ed25519 public key has 32 bytes (got {len(msg.weights_verify_key)})"
        )
    return JoinReply(
        msg.accepted, msg.peer_id, msg.reason, msg.policy_version, msg.weights_address, msg.weights_verify_key
    )


def heartbeat_to_proto(h: Heartbeat) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(peer_id=h.peer_id, policy_version=h.policy_version, load=h.load)


def heartbeat_from_proto(msg: pb.HeartbeatRequest) -> Heartbeat:
    _check_nonempty_text(msg.peer_id, "peer_id")
    _check_finite(msg.load, "load", minimum=0.0)
    if msg.load > 1.0:
        raise WireError("load", f"must be in [0, 1] (got {msg.load:g})")
    return Heartbeat(msg.peer_id, msg.policy_version, msg.load)


def readiness_to_proto(r: Readiness) -> pb.ReadyReply:
    return pb.ReadyReply(
        ready=r.ready,
        role=ROLES[r.role],
        worker_id=r.worker_id,
        device=r.device,
        device_memory_allocated=r.device_memory_allocated,
    )


def readiness_from_proto(msg: pb.ReadyReply) -> Readiness:
    _check_nonempty_text(msg.worker_id, "worker_id")
    if len(msg.device) > 64:
        raise WireError("device", f"at most 64 characters (got {len(msg.device)})")
    return Readiness(
        msg.ready, _role(msg.role, "role"), msg.worker_id, msg.device, int(msg.device_memory_allocated)
    )
