"""Chunked token log-probs: the same values and gradients as log_softmax + gather over float32 logits."""

from __future__ import annotations

import pytest
import torch

from decentralized_verl.core import token_logprobs as tl


def plain(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_elements", [1 << 20, 3000])
def test_values_and_gradients_equal_the_plain_expression(
    dtype, temperature, chunk_elements, monkeypatch
) -> None:
    monkeypatch.setattr(tl, "_CHUNK_ELEMENTS", chunk_elements)  # 3000: 3 rows a chunk, a ragged last chunk
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(50, 1000, generator=g) * 3).to(dtype)
    tokens = torch.randint(0, 1000, (50,), generator=g)
    tokens[:5] = tokens[0]  # repeated tokens scatter into the same column of different rows
    weights = torch.randn(50, generator=g)
    ours_in = logits.clone().requires_grad_()
    ours = tl.token_logprobs(ours_in, tokens, temperature)
    (ours * weights).sum().backward()
    ref_in = logits.clone().requires_grad_()
    ref = plain(ref_in, tokens, temperature)
    (ref * weights).sum().backward()
    assert ours.dtype == torch.float32 and ours_in.grad.dtype == dtype
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ours_in.grad.float(), ref_in.grad.float(), atol=tol, rtol=tol)


def test_float32_logits_are_left_as_they_were() -> None:
    logits = torch.randn(4, 10, requires_grad=True)
    before = logits.detach().clone()
    out = tl.token_logprobs(logits, torch.tensor([1, 2, 3, 4]), 0.5)
    out.sum().backward()
    assert torch.equal(logits.detach(), before)
    assert torch.all(out < 0)


def test_gradient_is_onehot_minus_softmax_over_temperature() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    tl.token_logprobs(logits, torch.tensor([2]), 2.0).sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.125, -0.125, 0.375, -0.125]]))


@pytest.mark.parametrize(
    ("logits", "tokens", "temperature", "message"),
    [
        (torch.zeros(3, 5), torch.zeros(2, dtype=torch.long), 1.0, "logits \\[N, V\\] and tokens \\[N\\]"),
        (torch.zeros(5), torch.zeros(5, dtype=torch.long), 1.0, "logits \\[N, V\\]"),
        (torch.zeros(3, 5), torch.zeros(3, dtype=torch.long), 0.0, "temperature must be > 0"),
        (torch.zeros(3, 5), torch.zeros(3, dtype=torch.long), -1.0, "temperature must be > 0"),
    ],
)
def test_bad_shapes_and_temperatures_are_named(logits, tokens, temperature, message) -> None:
    with pytest.raises(ValueError, match=message):
        tl.token_logprobs(logits, tokens, temperature)
