"""Weights leave the device in fixed-size buckets through one host staging buffer.

A publisher reads each parameter from the learner's device into the host memory the wire format is
built in. Copying a whole GPU tensor with `.to("cpu")` makes the host allocate pageable memory and the
driver stage it through its own bounce buffer; a large embedding also needs its whole size in transient
pinned memory on some paths. Here every device tensor passes through one reusable buffer of
BUCKET_BYTES, page-locked when the process computes on a GPU (`runtime.device.pins_memory`), so the
copy runs at the link's rate and the host holds, beyond the bytes being published, one bucket: the
publisher copies each bucket straight into its place in the version's one buffer (`copy_into`,
`weights/blob.py`). A tensor already on the CPU is copied into that buffer directly (or, through
`to_host`, used as it is).
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

from decentralized_verl.runtime import device

BUCKET_BYTES = 32 * 1024 * 1024
"""The staging buffer's size: large enough to keep a PCIe or NVLink copy at full rate, small next to
any model worth a GPU."""


def bucket_ranges(nbytes: int, bucket_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) of each bucket a tensor of `nbytes` is copied in: all full but the last."""
    return [(start, min(start + bucket_bytes, nbytes)) for start in range(0, nbytes, bucket_bytes)]


class HostStaging:
    """One reusable host buffer (pinned on a GPU process) that device tensors are copied out through."""

    def __init__(self, bucket_bytes: int = BUCKET_BYTES, *, pin: bool | None = None) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes: must be >= 1 (got {bucket_bytes})")
        self.bucket_bytes = bucket_bytes
        self.pin = device.pins_memory() if pin is None else pin
        self._buffer: Tensor | None = None  # made on first use: a CPU-only publisher never needs it
        self._lock = threading.Lock()
        self.buckets = 0
        """Buckets copied so far (how many device reads the publishing took)."""

    def _bucket(self) -> Tensor:
        if self._buffer is None:
            buffer = torch.empty(self.bucket_bytes, dtype=torch.uint8)
            self._buffer = buffer.pin_memory() if self.pin else buffer
        return self._buffer

    def copy_into(self, tensor: Tensor, target: Tensor) -> None:
        """Copy `tensor`'s bytes (any device, any layout) into `target`, a host uint8 tensor of exactly
        that many bytes (a place in a version's one buffer): straight from a host tensor, else bucket by
        bucket through the staging buffer, so the host holds no copy of the tensor besides `target`."""
        source = tensor.contiguous().reshape(-1).view(torch.uint8)
        if source.numel() != target.numel():
            raise ValueError(f"target: holds {target.numel()} bytes, the tensor has {source.numel()}")
        if tensor.device.type == "cpu":
            target.copy_(source)
            return
        with self._lock:
            bucket = self._bucket()
            for start, stop in bucket_ranges(source.numel(), self.bucket_bytes):
                staged = bucket[: stop - start]
                staged.copy_(source[start:stop], non_blocking=self.pin)
                if self.pin:
                    device.synchronize()  # the pinned copy is asynchronous: wait before reading it
                target[start:stop].copy_(staged)
                self.buckets += 1

    def to_host(self, tensor: Tensor) -> Tensor:
        """`tensor` (contiguous, any device) as a host tensor of the same dtype and shape: itself when it
        is on the CPU, else a new host tensor filled one bucket at a time."""
        if tensor.device.type == "cpu":
            return tensor
        out = torch.empty(tensor.shape, dtype=tensor.dtype)
        if tensor.numel() == 0:
            return out
        self.copy_into(tensor, out.reshape(-1).view(torch.uint8))
        return out
