"""The learner's side of weight deltas: a publisher that also keeps each version's delta from the one
before, so a receiver holding any of the last `max_chain` versions gets the newest as a chain of small
frames instead of the whole model.

What the learner holds: the newest `keep` encoded versions (as every publisher does) plus one
compressed frame per version for the last `max_chain` versions, nothing per receiver. A frame is made
when a version is stored, in a background thread, from the two newest bundles (so `keep` must be >= 2);
a receiver that asks before it is ready waits for it. A chain longer than `max_chain`, a base no
longer covered, or a chain larger than `max_fraction` of the full bundle is refused: the receiver
fetches the full bundle. A version where more than `max_fraction` of the bytes changed (fp32 weights
after a step) gets no delta at all, so the learner does not spend a compression pass per version on
deltas nobody would be sent.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading

from decentralized_verl.errors import WireError
from decentralized_verl.transport.weights.delta import encode_delta
from decentralized_verl.transport.weights.publish import Published, WeightPublisher

log = logging.getLogger(__name__)


class NoDelta(LookupError):
    """No chain from the receiver's version: it fetches the full bundle (the reason says why)."""


class DeltaPublisher(WeightPublisher):
    def __init__(self, *, max_chain: int = 8, max_fraction: float = 0.5, **kwargs) -> None:
        kwargs.setdefault("keep", 2)
        super().__init__(**kwargs)
        if self.keep < 2:
            raise ValueError(f"keep: a delta publisher holds >= 2 versions (got {self.keep})")
        if max_chain < 1:
            raise ValueError(f"max_chain: must be >= 1 (got {max_chain})")
        if not 0 < max_fraction <= 1:
            raise ValueError(f"max_fraction: must be in (0, 1] (got {max_fraction})")
        self.max_chain, self.max_fraction = max_chain, max_fraction
        self._frames: dict[int, concurrent.futures.Future[bytes | None]] = {}
        """Version -> its frame from version - 1 (None when no delta exists, e.g. the layout changed)."""
        self._frames_lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weight-delta")

    def store(self, published: Published) -> None:
        previous = self.get()
        super().store(published)
        version = published.manifest.version
        if previous is None or previous.manifest.version != version - 1:
            return  # a gap in versions: receivers below it get the full bundle
        future = self._pool.submit(self._frame, previous, published, self.max_fraction)
        with self._frames_lock:
            self._frames[version] = future
            for old in sorted(self._frames)[: -self.max_chain]:
                del self._frames[old]

    @staticmethod
    def _frame(previous: Published, published: Published, max_fraction: float) -> bytes | None:
        try:
            return encode_delta(
                previous.bundle.payload(),
                published.bundle.payload(),
                previous.manifest.version,
                published.manifest.version,
                max_changed=max_fraction,
            )
        except WireError as exc:
            log.info("no delta v%d -> v%d: %s", previous.manifest.version, published.manifest.version, exc)
            return None

    def chain(self, base: int, version: int, timeout: float = 120.0) -> list[bytes]:
        """The frames from `base` to `version`, oldest first; NoDelta when the receiver needs the full one."""
        held = self.get(version)
        if held is None:
            raise NoDelta(f"version {version} is not held (held: {self.versions})")
        if base >= version:
            raise NoDelta(f"base v{base} is not older than v{version}")
        if version - base > self.max_chain:
            raise NoDelta(
                f"v{base} is {version - base} versions behind v{version} (max chain {self.max_chain})"
            )
        with self._frames_lock:
            futures = [self._frames.get(v) for v in range(base + 1, version + 1)]
        if any(f is None for f in futures):
            raise NoDelta(f"no delta chain from v{base} (deltas held for {sorted(self._frames)})")
        frames = [f.result(timeout) for f in futures]  # type: ignore[union-attr]
        if any(f is None for f in frames):
            raise NoDelta(f"no delta between v{base} and v{version} (the layout changed, or too much did)")
        size = sum(len(f) for f in frames)  # type: ignore[arg-type]
        if size > self.max_fraction * held.manifest.total_bytes:
            raise NoDelta(f"the chain ({size} bytes) is not much smaller than the bundle")
        return frames  # type: ignore[return-value]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
