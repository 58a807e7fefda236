from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_ROLLOUT: _ClassVar[Role]
    ROLE_LEARNER: _ClassVar[Role]
    ROLE_CRITIC: _ClassVar[Role]
    ROLE_REWARD: _ClassVar[Role]
    ROLE_REFERENCE: _ClassVar[Role]
    ROLE_SPAN: _ClassVar[Role]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_PARTIAL: _ClassVar[FinishReason]
ROLE_UNSPECIFIED: Role
ROLE_ROLLOUT: Role
ROLE_LEARNER: Role
ROLE_CRITIC: Role
ROLE_REWARD: Role
ROLE_REFERENCE: Role
ROLE_SPAN: Role
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_PARTIAL: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("max_new_tokens", "temperature", "top_p", "top_k", "stop", "n", "seed")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    n: int
    seed: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., n: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class GenerateItem(_message.Message):
    __slots__ = ("prompt_id", "sample_index", "prompt_token_ids", "ground_truth", "prompt_text")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    sample_index: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ground_truth: str
    prompt_text: str
    def __init__(self, prompt_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., ground_truth: _Optional[str] = ..., prompt_text: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "policy_version", "sampling", "items")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    policy_version: int
    sampling: SamplingParams
    items: _containers.RepeatedCompositeFieldContainer[GenerateItem]
    def __init__(self, request_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., items: _Optional[_Iterable[_Union[GenerateItem, _Mapping]]] = ...) -> None: ...

class GenerateResult(_message.Message):
    __slots__ = ("request_id", "prompt_id", "sample_index", "response_token_ids", "logprobs", "finish_reason", "text", "policy_version", "worker_id", "generation_seconds", "episode")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_id: str
    sample_index: int
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: FinishReason
    text: str
    policy_version: int
    worker_id: str
    generation_seconds: float
    episode: Episode
    def __init__(self, request_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., text: _Optional[str] = ..., policy_version: _Optional[int] = ..., worker_id: _Optional[str] = ..., generation_seconds: _Optional[float] = ..., episode: _Optional[_Union[Episode, _Mapping]] = ...) -> None: ...

class Episode(_message.Message):
    __slots__ = ("loss_mask", "turns", "end_reason", "tool_calls", "tool_errors", "reward")
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[bool]
    turns: _containers.RepeatedScalarFieldContainer[str]
    end_reason: str
    tool_calls: int
    tool_errors: int
    reward: float
    def __init__(self, loss_mask: _Optional[_Iterable[bool]] = ..., turns: _Optional[_Iterable[str]] = ..., end_reason: _Optional[str] = ..., tool_calls: _Optional[int] = ..., tool_errors: _Optional[int] = ..., reward: _Optional[float] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "role", "policy_version", "tokens_per_second", "backend")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: Role
    policy_version: int
    tokens_per_second: float
    backend: str
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., policy_version: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., backend: _Optional[str] = ...) -> None: ...

class ManifestRequest(_message.Message):
    __slots__ = ("version", "latest")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    version: int
    latest: bool
    def __init__(self, version: _Optional[int] = ..., latest: _Optional[bool] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("version", "total_bytes", "digest", "chunk_digests", "chunk_bytes", "format", "dtype", "is_adapter", "signature")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    IS_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    version: int
    total_bytes: int
    digest: str
    chunk_digests: _containers.RepeatedScalarFieldContainer[str]
    chunk_bytes: int
    format: str
    dtype: str
    is_adapter: bool
    signature: bytes
    def __init__(self, version: _Optional[int] = ..., total_bytes: _Optional[int] = ..., digest: _Optional[str] = ..., chunk_digests: _Optional[_Iterable[str]] = ..., chunk_bytes: _Optional[int] = ..., format: _Optional[str] = ..., dtype: _Optional[str] = ..., is_adapter: _Optional[bool] = ..., signature: _Optional[bytes] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("version", "from_chunk")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FROM_CHUNK_FIELD_NUMBER: _ClassVar[int]
    version: int
    from_chunk: int
    def __init__(self, version: _Optional[int] = ..., from_chunk: _Optional[int] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("version", "index", "total", "data", "digest", "manifest")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    version: int
    index: int
    total: int
    data: bytes
    digest: str
    manifest: WeightManifest
    def __init__(self, version: _Optional[int] = ..., index: _Optional[int] = ..., total: _Optional[int] = ..., data: _Optional[bytes] = ..., digest: _Optional[str] = ..., manifest: _Optional[_Union[WeightManifest, _Mapping]] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("ok", "version", "chunks_received", "reason")
    OK_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    version: int
    chunks_received: int
    reason: str
    def __init__(self, ok: _Optional[bool] = ..., version: _Optional[int] = ..., chunks_received: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ScoreItem(_message.Message):
    __slots__ = ("prompt_text", "completion_text", "ground_truth", "reward_type")
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TEXT_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    REWARD_TYPE_FIELD_NUMBER: _ClassVar[int]
    prompt_text: str
    completion_text: str
    ground_truth: str
    reward_type: str
    def __init__(self, prompt_text: _Optional[str] = ..., completion_text: _Optional[str] = ..., ground_truth: _Optional[str] = ..., reward_type: _Optional[str] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ScoreItem, _Mapping]]] = ...) -> None: ...

class ScoreResult(_message.Message):
    __slots__ = ("score", "reason")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    score: float
    reason: str
    def __init__(self, score: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ScoreResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ScoreResult, _Mapping]]] = ...) -> None: ...

class Sequence(_message.Message):
    __slots__ = ("prompt_token_ids", "response_token_ids")
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SequenceBatch(_message.Message):
    __slots__ = ("items", "policy_version")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Sequence]
    policy_version: int
    def __init__(self, items: _Optional[_Iterable[_Union[Sequence, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class TokenValues(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class TokenValuesBatch(_message.Message):
    __slots__ = ("results", "policy_version", "worker_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TokenValues]
    policy_version: int
    worker_id: str
    def __init__(self, results: _Optional[_Iterable[_Union[TokenValues, _Mapping]]] = ..., policy_version: _Optional[int] = ..., worker_id: _Optional[str] = ...) -> None: ...

class CriticTrainItem(_message.Message):
    __slots__ = ("sequence", "returns", "old_values")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RETURNS_FIELD_NUMBER: _ClassVar[int]
    OLD_VALUES_FIELD_NUMBER: _ClassVar[int]
    sequence: Sequence
    returns: _containers.RepeatedScalarFieldContainer[float]
    old_values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, sequence: _Optional[_Union[Sequence, _Mapping]] = ..., returns: _Optional[_Iterable[float]] = ..., old_values: _Optional[_Iterable[float]] = ...) -> None: ...

class CriticTrainRequest(_message.Message):
    __slots__ = ("items", "policy_version")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[CriticTrainItem]
    policy_version: int
    def __init__(self, items: _Optional[_Iterable[_Union[CriticTrainItem, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class CriticTrainReply(_message.Message):
    __slots__ = ("loss", "version")
    LOSS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    loss: float
    version: int
    def __init__(self, loss: _Optional[float] = ..., version: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("step", "total_steps", "phase", "state", "reward_mean", "reward_std", "kl", "response_length_mean", "policy_version", "tokens_per_second", "phase_seconds", "last_checkpoint", "eval_accuracy", "volunteers", "blocked_peers", "refit_parity", "failure", "failure_reason")
    class PhaseSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    REWARD_STD_FIELD_NUMBER: _ClassVar[int]
    KL_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LENGTH_MEAN_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    PHASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    EVAL_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    VOLUNTEERS_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_PEERS_FIELD_NUMBER: _ClassVar[int]
    REFIT_PARITY_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    phase: str
    state: str
    reward_mean: float
    reward_std: float
    kl: float
    response_length_mean: float
    policy_version: int
    tokens_per_second: float
    phase_seconds: _containers.ScalarMap[str, float]
    last_checkpoint: str
    eval_accuracy: float
    volunteers: int
    blocked_peers: _containers.RepeatedCompositeFieldContainer[BlockedPeer]
    refit_parity: RefitParity
    failure: str
    failure_reason: str
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., phase: _Optional[str] = ..., state: _Optional[str] = ..., reward_mean: _Optional[float] = ..., reward_std: _Optional[float] = ..., kl: _Optional[float] = ..., response_length_mean: _Optional[float] = ..., policy_version: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., phase_seconds: _Optional[_Mapping[str, float]] = ..., last_checkpoint: _Optional[str] = ..., eval_accuracy: _Optional[float] = ..., volunteers: _Optional[int] = ..., blocked_peers: _Optional[_Iterable[_Union[BlockedPeer, _Mapping]]] = ..., refit_parity: _Optional[_Union[RefitParity, _Mapping]] = ..., failure: _Optional[str] = ..., failure_reason: _Optional[str] = ...) -> None: ...

class RefitParity(_message.Message):
    __slots__ = ("diff_mean", "diff_max", "version", "tokens")
    DIFF_MEAN_FIELD_NUMBER: _ClassVar[int]
    DIFF_MAX_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    diff_mean: float
    diff_max: float
    version: int
    tokens: int
    def __init__(self, diff_mean: _Optional[float] = ..., diff_max: _Optional[float] = ..., version: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class BlockedPeer(_message.Message):
    __slots__ = ("peer_id", "reason")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    reason: str
    def __init__(self, peer_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("job", "token", "role", "hardware", "tokens_per_second")
    JOB_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    job: str
    token: str
    role: Role
    hardware: str
    tokens_per_second: float
    def __init__(self, job: _Optional[str] = ..., token: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., hardware: _Optional[str] = ..., tokens_per_second: _Optional[float] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("accepted", "peer_id", "reason", "policy_version", "weights_address", "weights_verify_key")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERIFY_KEY_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    peer_id: str
    reason: str
    policy_version: int
    weights_address: str
    weights_verify_key: bytes
    def __init__(self, accepted: _Optional[bool] = ..., peer_id: _Optional[str] = ..., reason: _Optional[str] = ..., policy_version: _Optional[int] = ..., weights_address: _Optional[str] = ..., weights_verify_key: _Optional[bytes] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("peer_id", "policy_version", "load")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    policy_version: int
    load: float
    def __init__(self, peer_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., load: _Optional[float] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("ok", "reason")
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    reason: str
    def __init__(self, ok: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ParamDigestsRequest(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class ParamDigests(_message.Message):
    __slots__ = ("epoch", "chunk_bytes", "digests")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    chunk_bytes: int
    digests: bytes
    def __init__(self, epoch: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., digests: _Optional[bytes] = ...) -> None: ...

class ParamChunksRequest(_message.Message):
    __slots__ = ("epoch", "indices")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, epoch: _Optional[int] = ..., indices: _Optional[_Iterable[int]] = ...) -> None: ...

class ParamChunk(_message.Message):
    __slots__ = ("index", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ParamSyncedRequest(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class ParamSyncedReply(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class ReadyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReadyReply(_message.Message):
    __slots__ = ("ready", "role", "worker_id", "device", "device_memory_allocated")
    READY_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    role: Role
    worker_id: str
    device: str
    device_memory_allocated: int
    def __init__(self, ready: _Optional[bool] = ..., role: _Optional[_Union[Role, str]] = ..., worker_id: _Optional[str] = ..., device: _Optional[str] = ..., device_memory_allocated: _Optional[int] = ...) -> None: ...
