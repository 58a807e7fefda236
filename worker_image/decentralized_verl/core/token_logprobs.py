"""log softmax(logits / T) at one token per row, without a float32 copy of the whole [N, V] logits.

The learner needs one number per response token, yet the plain expression (``logits.float()``, then
``log_softmax``, then ``gather``) writes three [N, V] float32 tensors forward and three more backward (the
gather's zero-filled gradient, the log-softmax gradient, the cast back), each as large as the LM head's
output: for a 49k vocabulary that memory traffic costs more than the head's matmul on a CPU with bf16 units.
Here the rows are taken in cache-sized chunks: forward keeps only each row's log-sum-exp, backward rebuilds
the softmax of a chunk from the logits and writes the gradient ``(onehot - softmax) / T`` straight in the
logits' dtype. Values equal the plain expression's to float32 rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

_CHUNK_ELEMENTS = 1 << 20
"""Float32 elements per chunk (4 MiB): a chunk's softmax stays in cache between its passes."""


def _rows_per_chunk(vocab: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(vocab, 1))


def _scaled_chunk(logits: Tensor, start: int, end: int, temperature: float) -> Tensor:
    """Rows start:end of ``logits`` as a fresh float32 tensor, divided by ``temperature``."""
    block = logits[start:end].to(torch.float32, copy=True)
    if temperature != 1.0:
        block.div_(temperature)
    return block


class _TokenLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:  # type: ignore[override]
        rows = _rows_per_chunk(logits.shape[-1])
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], rows):
            end = min(start + rows, logits.shape[0])
            lse[start:end] = torch.logsumexp(_scaled_chunk(logits, start, end, temperature), dim=-1)
        picked = logits.gather(-1, tokens[:, None]).squeeze(-1).float() / temperature
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature = temperature
        return picked - lse

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        logits, tokens, lse = ctx.saved_tensors
        temperature: float = ctx.temperature
        grad = grad.float()
        out = torch.empty_like(logits)
        rows = _rows_per_chunk(logits.shape[-1])
        for start in range(0, logits.shape[0], rows):
            end = min(start + rows, logits.shape[0])
            g = grad[start:end, None]
            block = _scaled_chunk(logits, start, end, temperature)
            block.sub_(lse[start:end, None]).exp_().mul_(-g)  # -g * softmax
            block.scatter_add_(-1, tokens[start:end, None], g)  # + g at the token
            if temperature != 1.0:
                block.div_(temperature)
            out[start:end] = block
        return out, None, None


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """[N] float32 ``log_softmax(logits / temperature)[i, tokens[i]]`` for [N, V] ``logits`` of any float
    dtype, differentiable in ``logits``."""
    if logits.dim() != 2 or tokens.shape != logits.shape[:1]:
        raise ValueError(f"token_logprobs: logits [N, V] and tokens [N] (got {logits.shape}, {tokens.shape})")
    if not temperature or temperature <= 0:
        raise ValueError(f"token_logprobs: temperature must be > 0 (got {temperature})")
    return _TokenLogProb.apply(logits, tokens, float(temperature))
