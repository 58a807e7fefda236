"""The front of a span chain as a `GenerationBackend`: the HF backend's own decode loop and sampler, with
the decoder layers replaced by a chain session, so responses, log-probs, seeds and stop strings follow
exactly the single-process rules (`backends.hf`).

The front holds the embeddings, the final norm and the LM head; every micro-batch opens one session in
the chain (prefill and every decode step go through all spans as one batch) and closes it when the batch
ends, whatever way it ends. A weight refresh splits the state dict by layout: the front copies its own
tensors, each span receives only its layers' (`Chain.load_weights`), and nothing changes anywhere unless
every part checks out first (the front's part is checked before any span is touched).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from decentralized_verl.backends.hf import HFBackend, _Row
from decentralized_verl.backends.weight_copy import plan_weight_copy
from decentralized_verl.serving.spans.blocks import FrontModel, build_front, spec_parts
from decentralized_verl.serving.spans.chain import Chain, ChainSession
from decentralized_verl.serving.spans.layout import Span, check_layout, even_layout, split_state


class SpanBackend(HFBackend):
    """Generation through a chain of span servers; `chain.routes` name the spans and their replicas."""

    def __init__(self, front: FrontModel, tokenizer: Any, chain: Chain, **kw: Any) -> None:
        check_layout([r.span for r in chain.routes], int(front.config.num_hidden_layers), field="spans")
        super().__init__(front, tokenizer, **kw)
        self.chain = chain
        chain.version = self._version
        self._sessions: list[ChainSession] = []

    @classmethod
    def from_spec(
        cls,
        spec: Any,
        spans: Sequence[Span] | int,
        replicas: Sequence[Sequence[str]],
        *,
        chain_options: Mapping[str, Any] | None = None,
        **kw: Any,
    ) -> SpanBackend:
        """The front of `spec.model`'s model (reading only the front's tensors) over the given servers;
        `spans` is the layout, or a count to split the layers evenly."""
        from decentralized_verl.runtime import compute_thread

        config, tokenizer, source, dtype = spec_parts(spec)
        if isinstance(spans, int):  # a count: the layers split evenly
            spans = even_layout(int(config.num_hidden_layers), spans)
        front = compute_thread.call(build_front, config, source, dtype)
        chain = Chain(spans, replicas, int(config.hidden_size), **dict(chain_options or {}))
        return cls(front, tokenizer, chain, **kw)

    def _new_cache(self, capacity: int) -> ChainSession:
        session = self.chain.session(capacity)
        self._sessions.append(session)
        return session

    def _run_batch(self, rows: list[_Row]) -> None:
        try:
            super()._run_batch(rows)
        finally:
            sessions, self._sessions = self._sessions, []
            for session in sessions:
                session.close()

    def load_weights(self, state_dict: Mapping[str, Tensor], version: int, *, partial: bool = False) -> None:
        """Front tensors into the front, each span's into its servers; checked before anything changes."""
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version: must be an integer >= 0 (got {version!r})")
        if partial:
            raise ValueError("a span chain takes whole state dicts (LoRA jobs cannot be served as spans)")
        front, parts = split_state(state_dict, tuple(r.span for r in self.chain.routes))
        with self._lock:
            plan = plan_weight_copy(self.model, front)
            self.chain.load_weights(parts, version)
            with torch.no_grad():
                for target, source in plan:
                    target.copy_(source)
            self._version = version

    def mark_version(self, version: int) -> None:
        raise RuntimeError("a span chain holds no learner's model: its weights arrive through load_weights")

    def close(self) -> None:
        self.chain.close()


def parse_span_addresses(text: str, *, field: str = "DVERL_SPAN_ADDRS") -> list[list[str]]:
    """`a,b;c;d` -> [[a, b], [c], [d]]: the spans in chain order, each span's servers."""
    chain = [[a.strip() for a in span.split(",") if a.strip()] for span in text.split(";")]
    if not text.strip() or any(not servers for servers in chain):
        raise ValueError(f"{field}: every span needs at least one host:port (got {text!r})")
    return chain
