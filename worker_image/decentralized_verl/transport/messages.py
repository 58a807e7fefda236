"""Protobuf messages <-> small frozen dataclasses, with the checks a receiver must make.

Every message that crosses a process boundary may come from a buggy or dishonest peer (a volunteer's
results are untrusted), so the `*_from_proto` functions validate before anything reaches training:
lengths that must align, NaN/inf numbers, log-probs above 0, token ids outside the vocabulary, empty
responses, a missing or wrong policy version, oversized batches. A violation raises `WireError` whose
text names the field path, e.g. `results[3].logprobs: length 5 does not match response_token_ids
length 6`, so the caller can log the reason and re-dispatch the work.

The `*_to_proto` functions trust their input (it was built by our own code) and only convert.
Pure functions: no gRPC, no I/O, no torch.

The converters live in `transport.wire`, one module per service; this module is the one place callers
import them from.
"""

from __future__ import annotations

from decentralized_verl.errors import WireError
from decentralized_verl.transport.wire.common import (
    FINISH_REASONS,
    LOGPROB_SLACK,
    ROLES,
    WireLimits,
    role_from_name,
)
from decentralized_verl.transport.wire.param_sync import (
    PARAM_DIGEST_SIZE,
    param_chunk_from_proto,
    param_chunk_to_proto,
    param_chunks_request_from_proto,
    param_chunks_request_to_proto,
    param_digests_from_proto,
    param_digests_request_from_proto,
    param_digests_request_to_proto,
    param_digests_to_proto,
    param_synced_reply_from_proto,
    param_synced_reply_to_proto,
    param_synced_request_from_proto,
    param_synced_request_to_proto,
)
from decentralized_verl.transport.wire.rollout import (
    Completion,
    EpisodeReport,
    GenerateBatch,
    GenerateItem,
    SamplingParams,
    WorkerInfo,
    check_all_answered,
    completion_from_proto,
    completion_to_proto,
    generate_request_from_proto,
    generate_request_to_proto,
    worker_info_from_proto,
    worker_info_to_proto,
)
from decentralized_verl.transport.wire.scoring import (
    CriticTrainItem,
    Score,
    ScoreItem,
    SequenceBatch,
    SequencePair,
    TokenValues,
    critic_train_request_from_proto,
    critic_train_request_to_proto,
    score_request_from_proto,
    score_request_to_proto,
    scores_from_proto,
    scores_to_proto,
    sequence_batch_from_proto,
    sequence_batch_to_proto,
    token_values_from_proto,
    token_values_to_proto,
)
from decentralized_verl.transport.wire.status import (
    JobStatus,
    job_status_from_proto,
    job_status_to_proto,
)
from decentralized_verl.transport.wire.volunteer import (
    Heartbeat,
    JoinReply,
    JoinRequest,
    Readiness,
    heartbeat_from_proto,
    heartbeat_to_proto,
    join_reply_from_proto,
    join_reply_to_proto,
    join_request_from_proto,
    join_request_to_proto,
    readiness_from_proto,
    readiness_to_proto,
)
from decentralized_verl.transport.wire.weights import (
    WeightChunk,
    WeightManifest,
    chunk_from_proto,
    chunk_to_proto,
    manifest_from_proto,
    manifest_to_proto,
)

__all__ = [
    "FINISH_REASONS",
    "LOGPROB_SLACK",
    "PARAM_DIGEST_SIZE",
    "ROLES",
    "Completion",
    "CriticTrainItem",
    "EpisodeReport",
    "GenerateBatch",
    "GenerateItem",
    "Heartbeat",
    "JobStatus",
    "JoinReply",
    "JoinRequest",
    "Readiness",
    "SamplingParams",
    "Score",
    "ScoreItem",
    "SequenceBatch",
    "SequencePair",
    "TokenValues",
    "WeightChunk",
    "WeightManifest",
    "WireError",
    "WireLimits",
    "WorkerInfo",
    "check_all_answered",
    "chunk_from_proto",
    "chunk_to_proto",
    "completion_from_proto",
    "completion_to_proto",
    "critic_train_request_from_proto",
    "critic_train_request_to_proto",
    "generate_request_from_proto",
    "generate_request_to_proto",
    "heartbeat_from_proto",
    "heartbeat_to_proto",
    "job_status_from_proto",
    "job_status_to_proto",
    "join_reply_from_proto",
    "join_reply_to_proto",
    "join_request_from_proto",
    "join_request_to_proto",
    "manifest_from_proto",
    "manifest_to_proto",
    "param_chunk_from_proto",
    "param_chunk_to_proto",
    "param_chunks_request_from_proto",
    "param_chunks_request_to_proto",
    "param_digests_from_proto",
    "param_digests_request_from_proto",
    "param_digests_request_to_proto",
    "param_digests_to_proto",
    "param_synced_reply_from_proto",
    "param_synced_reply_to_proto",
    "param_synced_request_from_proto",
    "param_synced_request_to_proto",
    "readiness_from_proto",
    "readiness_to_proto",
    "role_from_name",
    "score_request_from_proto",
    "score_request_to_proto",
    "scores_from_proto",
    "scores_to_proto",
    "sequence_batch_from_proto",
    "sequence_batch_to_proto",
    "token_values_from_proto",
    "token_values_to_proto",
    "worker_info_from_proto",
    "worker_info_to_proto",
]
