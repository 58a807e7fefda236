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

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from decentralized_verl.backends.hf import HFBackend, _Row
from decentralized_verl.backends.weight_copy import plan_weight_copy
from decentralized_verl.errors import WireError
from decentralized_verl.runtime import compute_thread
from decentralized_verl.security.trust import PROCESS_KEY, weights_verify_key
from decentralized_verl.spans import signed
from decentralized_verl.spans.blocks import FrontModel, build_front, spec_parts
from decentralized_verl.spans.chain import Chain, ChainSession
from decentralized_verl.spans.layout import Span, check_layout, even_layout, split_state
from decentralized_verl.spans.signed import METADATA_KEY, from_metadata


class SpanBackend(HFBackend):
    """Generation through a chain of span servers; `chain.routes` name the spans and their replicas."""

    def __init__(
        self, front: FrontModel, tokenizer: Any, chain: Chain, *, verify_key: Any = PROCESS_KEY, **kw: Any
    ) -> None:
        """`verify_key`: the learner's weight key (default: this process's); with one, every refresh must
        carry a signed manifest per span, checked here before any span is touched."""
        check_layout([r.span for r in chain.routes], int(front.config.num_hidden_layers), field="spans")
        super().__init__(front, tokenizer, **kw)
        self.chain = chain
        chain.head = front.head  # the token check carries checked hops through to the next-token logits
        self.verify_key = weights_verify_key() if verify_key is PROCESS_KEY else verify_key
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

    def _run_batch(self, rows: list[_Row]) -> Iterator[None]:
        try:
            yield from super()._run_batch(rows)
        finally:
            sessions, self._sessions = self._sessions, []
            for session in sessions:
                session.close()

    def load_weights(self, state_dict: Mapping[str, Tensor], version: int, *, partial: bool = False) -> None:
        """Front tensors into the front, each span's into its servers with the learner's signed manifest
        of that span (from the bundle's metadata); checked before anything changes."""
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version: must be an integer >= 0 (got {version!r})")
        if partial:
            raise ValueError("a span chain takes whole state dicts (LoRA jobs cannot be served as spans)")
        spans = tuple(r.span for r in self.chain.routes)
        front, parts = split_state(state_dict, spans)
        manifests = _manifests_for(spans, getattr(state_dict, "metadata", {}), version)
        for span, part, manifest in zip(spans, parts, manifests, strict=True):
            signed.check(manifest, span, version, part, self.verify_key)  # a span would refuse it anyway
        with self._lock:
            plan = plan_weight_copy(self.model, front)
            self.chain.load_weights(parts, version, manifests)
            with torch.no_grad():
                for target, source in plan:
                    target.copy_(source)
            self._version = version

    def attach(self, index: int, client: Any) -> bool:
        """Add a replica (a span volunteer) to span `index` between micro-batches, brought to the chain's
        version first; False when it holds another version and the chain has no weights to give it yet
        (before the first refresh the chain computes with the spec's own weights: the replica must too)."""
        held = int(client.info()["version"])  # asked before the lock: a slow peer holds up no batch
        with self._lock:
            if held != self.chain.version:
                if self.chain.parts is None:
                    return False
                self.chain.bring_up_to_date(index, client)
            self.chain.attach(index, client)
            return True

    def mark_version(self, version: int) -> None:
        raise RuntimeError("a span chain holds no learner's model: its weights arrive through load_weights")

    def close(self) -> None:
        self.chain.close()


def _manifests_for(spans: tuple[Span, ...], metadata: Mapping[str, str], version: int) -> list[Any]:
    """Each span's signed manifest from a bundle's metadata (None each when it carries none); a bundle
    signed for another layout is refused here, before any span is touched."""
    signed_spans = from_metadata(metadata)
    if signed_spans is None:
        return [None] * len(spans)
    by_span = {m.span: m for m in signed_spans}
    missing = [str(s) for s in spans if s not in by_span]
    if missing:
        raise WireError(
            f"weights.{METADATA_KEY}",
            f"v{version} signs layers {sorted(str(s) for s in by_span)}, not this chain's spans {missing}",
        )
    return [by_span[s] for s in spans]


def parse_span_addresses(text: str, *, field: str = "DVERL_SPAN_ADDRS") -> list[list[str]]:
    """`a,b;c;d` -> [[a, b], [c], [d]]: the spans in chain order, each span's servers."""
    chain = [[a.strip() for a in span.split(",") if a.strip()] for span in text.split(";")]
    if not text.strip() or any(not servers for servers in chain):
        raise ValueError(f"{field}: every span needs at least one host:port (got {text!r})")
    return chain
