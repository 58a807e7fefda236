"""GSPO, CISPO and the plain policy gradient against per-token loop references (values and gradients) and
hand-worked numbers; the registry's blind call; per-token weights in every loss."""

from __future__ import annotations

import math

import pytest
import torch

from decentralized_verl.algorithms import registry
from decentralized_verl.algorithms.gspo import gspo_policy_loss
from decentralized_verl.algorithms.policy_loss import ppo_policy_loss
from decentralized_verl.algorithms.weighted_pg import cispo_policy_loss, vanilla_pg_loss
from decentralized_verl.spec.catalogue.algorithms import POLICY_LOSS_NAMES
from tests.support.loss_references import AGGREGATIONS, SHAPES, holey_mask, rand, ref_aggregate, valid


def batch(shape, seed, per_sample_advantage=False):
    gen = torch.Generator().manual_seed(seed)
    mask = holey_mask(*shape, gen)
    old = rand(shape, gen) - 2.0
    logp = (old + rand(shape, gen, 0.3)).requires_grad_(True)
    adv = rand(shape, gen)
    if per_sample_advantage:
        adv = adv[:, :1].expand(shape).clone()
    weights = torch.rand(*shape, generator=gen, dtype=torch.float64) * 2
    return mask, old, logp, adv, weights


def grads_match(loss, logp, ref, logp_ref):
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(loss, ref)
    if ref.requires_grad:
        (ref_grad,) = torch.autograd.grad(ref, logp_ref)
        torch.testing.assert_close(grad, ref_grad)
    else:
        assert torch.equal(grad, torch.zeros_like(grad))


# ---------------------------------------------------------------- GSPO


def ref_gspo_sequence(logp, old, adv, mask, low, high):
    """The paper's objective with one advantage per sequence: mean_i max(-A s_i, -A clip(s_i)) with
    s_i = exp(mean_t log(pi/pi_old)), differentiated through s_i itself (no token form, no stop-gradient)."""
    losses = []
    for b in range(mask.shape[0]):
        ts = valid(mask, b)
        if not ts:
            continue
        s = torch.exp(sum(logp[b, t] - old[b, t] for t in ts) / len(ts))
        a = float(adv[b, ts[0]])
        losses.append(torch.maximum(-a * s, -a * torch.clamp(s, 1 - low, 1 + high)))
    return sum(losses) / len(losses) if losses else torch.tensor(0.0, dtype=torch.float64)


def ref_gspo_token(logp, old, adv, mask, low, high, weights=None):
    """GSPO-token, one token at a time: s_t = sg[s_i] * pi_t / sg[pi_t]."""
    per_token = {}
    for b in range(mask.shape[0]):
        ts = valid(mask, b)
        if not ts:
            continue
        s_seq = math.exp(sum(float(logp[b, t].detach() - old[b, t]) for t in ts) / len(ts))
        for t in ts:
            s = s_seq * torch.exp(logp[b, t] - logp[b, t].detach())
            a = float(adv[b, t])
            loss = torch.maximum(-a * s, -a * torch.clamp(s, 1 - low, 1 + high))
            per_token[b, t] = loss * (1.0 if weights is None else float(weights[b, t]))
    return ref_aggregate(per_token, mask, "seq_mean_token_mean")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("low", "high"), [(3e-4, 4e-4), (0.05, 0.08), (0.2, 0.2)])
def test_gspo_with_one_advantage_per_sample_is_the_sequence_objective(shape, seed, low, high):
    mask, old, logp, adv, _ = batch(shape, seed, per_sample_advantage=True)
    loss, metrics = gspo_policy_loss(logp, old, adv, mask, clip_low=low, clip_high=high)
    logp_ref = logp.detach().clone().requires_grad_(True)
    grads_match(loss, logp, ref_gspo_sequence(logp_ref, old, adv, mask, low, high), logp_ref)
    rows = [b for b in range(shape[0]) if valid(mask, b)]
    seq = [
        math.exp(sum(float(logp.detach()[b, t] - old[b, t]) for t in valid(mask, b)) / len(valid(mask, b)))
        for b in rows
    ]
    assert metrics["seq_ratio_mean"] == pytest.approx(sum(seq) / len(seq))
    assert metrics["seq_ratio_max"] == pytest.approx(max(seq))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("weighted", [False, True])
def test_gspo_token_form_matches_loop(shape, seed, weighted):
    mask, old, logp, adv, weights = batch(shape, seed)
    w = weights if weighted else None
    loss, _ = gspo_policy_loss(logp, old, adv, mask, clip_low=0.05, clip_high=0.08, weights=w)
    logp_ref = logp.detach().clone().requires_grad_(True)
    grads_match(loss, logp, ref_gspo_token(logp_ref, old, adv, mask, 0.05, 0.08, w), logp_ref)


def test_gspo_hand_worked():
    # token ratios 2 and 1/2: PPO clips both tokens; GSPO's sequence ratio is exp(mean(log 2, log 1/2)) = 1
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[math.log(2.0), math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    one = torch.ones(1, 2, dtype=torch.float64)
    loss, metrics = gspo_policy_loss(logp, old, one, one)
    assert loss.item() == pytest.approx(-1.0) and metrics["clip_frac"] == 0.0
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -0.5]], dtype=torch.float64))  # -A * s / |y|
    # ratios 1.2 and 0.8: s = sqrt(0.96) = 0.9798. A = +1: max(-0.9798, -0.9997) keeps the unclipped
    # branch; A = -1: max(0.9798, 0.9997) is the clipped one, and the whole answer gets no gradient.
    logp = torch.tensor([[math.log(1.2), math.log(0.8)]], dtype=torch.float64, requires_grad=True)
    loss, metrics = gspo_policy_loss(logp, old, one, one)
    assert loss.item() == pytest.approx(-math.sqrt(0.96)) and metrics["clip_frac"] == 0.0
    loss, metrics = gspo_policy_loss(logp, old, -one, one)
    assert loss.item() == pytest.approx(1 - 3e-4) and metrics["clip_frac"] == 1.0
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.equal(grad, torch.zeros(1, 2, dtype=torch.float64))


def test_gspo_refuses_a_length_weighted_aggregation():
    x, one = torch.zeros(2, 3), torch.ones(2, 3)
    for mode in ("token_mean", "seq_mean_token_sum"):
        with pytest.raises(ValueError, match="gspo: aggregation must be 'seq_mean_token_mean'"):
            gspo_policy_loss(x, x, x, one, aggregation=mode)


# ---------------------------------------------------------------- CISPO and the plain policy gradient


def ref_weighted_pg(logp, old, adv, mask, mode, low, high, weights=None):
    """-sg[clip(r)] * A * log pi per token (low None: no lower bound; high None: no clip at all)."""
    per_token, clipped, total = {}, 0, 0
    for b in range(mask.shape[0]):
        for t in valid(mask, b):
            r = math.exp(max(-20.0, min(20.0, float(logp[b, t].detach()) - float(old[b, t]))))
            w = 1.0 if high is None else min(max(r, 0.0 if low is None else 1 - low), 1 + high)
            clipped += int(high is not None and w != r)
            total += 1
            extra = 1.0 if weights is None else float(weights[b, t])
            per_token[b, t] = -w * float(adv[b, t]) * logp[b, t] * extra
    return ref_aggregate(per_token, mask, mode), clipped / max(total, 1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize(("low", "high"), [(None, 0.2), (0.2, 0.28), (None, 4.0)])
@pytest.mark.parametrize("weighted", [False, True])
def test_cispo_matches_loop(shape, mode, low, high, weighted):
    mask, old, logp, adv, weights = batch(shape, 3)
    w = weights if weighted else None
    loss, metrics = cispo_policy_loss(
        logp, old, adv, mask, clip_low=low, clip_high=high, aggregation=mode, weights=w
    )
    logp_ref = logp.detach().clone().requires_grad_(True)
    ref, clip_frac = ref_weighted_pg(logp_ref, old, adv, mask, mode, low, high, w)
    grads_match(loss, logp, ref, logp_ref)
    assert metrics["clip_frac"] == pytest.approx(clip_frac)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_vanilla_pg_matches_loop(shape, mode, weighted):
    mask, old, logp, adv, weights = batch(shape, 4)
    w = weights if weighted else None
    loss, metrics = vanilla_pg_loss(logp, old, adv, mask, aggregation=mode, weights=w)
    logp_ref = logp.detach().clone().requires_grad_(True)
    ref, _ = ref_weighted_pg(logp_ref, old, adv, mask, mode, None, None, w)
    grads_match(loss, logp, ref, logp_ref)
    assert metrics["clip_frac"] == 0.0


def test_cispo_and_vanilla_pg_hand_worked():
    one = torch.ones(1, 1, dtype=torch.float64)
    old = torch.zeros(1, 1, dtype=torch.float64)
    # ratio 1.5, A = 1: PPO's clipped branch gives no gradient; CISPO's weight is cut to 1.2 and kept.
    logp = torch.tensor([[math.log(1.5)]], dtype=torch.float64, requires_grad=True)
    loss, _ = ppo_policy_loss(logp, old, one, one)
    assert torch.autograd.grad(loss, logp)[0].item() == 0.0
    loss, metrics = cispo_policy_loss(logp, old, one, one, clip_high=0.2)
    assert loss.item() == pytest.approx(-1.2 * math.log(1.5)) and metrics["clip_frac"] == 1.0
    assert torch.autograd.grad(loss, logp)[0].item() == pytest.approx(-1.2)
    # ratio 0.5, A = 1: no lower bound by default (weight 0.5), clip_low 0.2 lifts it to 0.8
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    loss, _ = cispo_policy_loss(logp, old, one, one)
    assert torch.autograd.grad(loss, logp)[0].item() == pytest.approx(-0.5)
    loss, _ = cispo_policy_loss(logp, old, one, one, clip_low=0.2)
    assert torch.autograd.grad(loss, logp)[0].item() == pytest.approx(-0.8)
    # vanilla: -A log pi = 2 log 2 whatever the old policy said; gradient -A
    for old_lp in (0.0, -3.0):
        loss, _ = vanilla_pg_loss(logp, torch.full((1, 1), old_lp, dtype=torch.float64), 2 * one, one)
        assert loss.item() == pytest.approx(2 * math.log(2))
        assert torch.autograd.grad(loss, logp)[0].item() == pytest.approx(-2.0)


def test_on_policy_every_loss_has_the_policy_gradient():
    """At ratio 1 (pi_old = pi) PPO, GSPO (one advantage per sample, seq-mean), CISPO and the plain policy
    gradient all give grad = -A grad log pi under the same aggregation."""
    gen = torch.Generator().manual_seed(9)
    shape = (5, 6)
    mask = holey_mask(*shape, gen)
    adv = rand(shape, gen)[:, :1].expand(shape).clone()
    logp = (rand(shape, gen) - 2).requires_grad_(True)
    old = logp.detach().clone()
    grads = {}
    for name in POLICY_LOSS_NAMES:
        fn = registry.lookup(registry.POLICY_LOSSES, "policy loss", name)
        loss, _ = fn(logp, old, adv, mask, aggregation="seq_mean_token_mean")
        grads[name] = torch.autograd.grad(loss, logp)[0]
    for name, grad in grads.items():
        torch.testing.assert_close(grad, grads["vanilla_pg"], msg=name)


def test_ppo_clip_weights_scale_each_tokens_loss():
    """Per-token weights multiply the clipped loss before aggregation: constant c scales loss and gradient."""
    mask, old, logp, adv, weights = batch((6, 5), 5)
    base, _ = ppo_policy_loss(logp, old, adv, mask, aggregation="seq_mean_token_sum")
    scaled, _ = ppo_policy_loss(
        logp, old, adv, mask, aggregation="seq_mean_token_sum", weights=torch.full_like(weights, 0.25)
    )
    torch.testing.assert_close(scaled, 0.25 * base)
    zero, _ = ppo_policy_loss(logp, old, adv, mask, weights=torch.zeros_like(weights))
    assert zero.item() == 0.0
    assert torch.equal(torch.autograd.grad(zero, logp)[0], torch.zeros_like(logp))


# ---------------------------------------------------------------- registry


def test_blind_call_hands_each_loss_only_its_settings_and_refuses_typos():
    x, one = torch.zeros(2, 3), torch.ones(2, 3)
    settings = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0, "skip_threshold": 2.0, "weights": None}
    for name in POLICY_LOSS_NAMES:
        fn = registry.lookup(registry.POLICY_LOSSES, "policy loss", name)
        aggregation = "seq_mean_token_mean" if name == "gspo" else "token_mean"
        loss, metrics = fn(x, x, one, one, aggregation=aggregation, **settings)
        assert torch.isfinite(loss) and "approx_kl" in metrics
        with pytest.raises(TypeError, match=r"unknown setting\(s\) \['clip_lo'\]"):
            fn(x, x, one, one, clip_lo=0.1)


def test_unknown_policy_loss_lists_the_known():
    with pytest.raises(ValueError, match=r"cispo.*gspo.*ppo_clip.*vanilla_pg"):
        registry.lookup(registry.POLICY_LOSSES, "policy loss", "ppo2")
