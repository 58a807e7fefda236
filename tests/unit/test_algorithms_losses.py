"""Policy loss, value loss and KL against per-token loop references and hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from decentralized_verl.algorithms.kl import KL_ESTIMATORS, kl_in_loss, kl_in_reward, token_kl
from decentralized_verl.algorithms.policy_loss import POLICY_LOSS_AGGREGATIONS, aggregate, ppo_policy_loss
from decentralized_verl.algorithms.value_loss import clipped_value_loss
from tests.support.loss_references import AGGREGATIONS, SHAPES, holey_mask, rand, ref_aggregate, valid


def ref_policy_loss(logp, old, adv, mask, clip_low, clip_high, dual_clip, mode, skip_threshold):
    keep = mask.clone()
    skipped = 0
    for b in range(mask.shape[0]):
        ts = valid(mask, b)
        if skip_threshold is not None and ts:
            mean_ratio = sum(
                math.exp(max(-20, min(20, float(logp[b, t].detach() - old[b, t])))) for t in ts
            ) / len(ts)
            if mean_ratio > skip_threshold:
                keep[b] = 0.0
                skipped += 1
    per_token, clipped_count, total = {}, 0, 0
    for b in range(mask.shape[0]):
        for t in valid(keep, b):
            ratio = torch.exp(torch.clamp(logp[b, t] - old[b, t], -20, 20))
            a = float(adv[b, t])
            surrogate = -a * ratio
            clipped = -a * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
            loss = torch.maximum(surrogate, clipped)
            if dual_clip is not None and a < 0:
                loss = torch.minimum(loss, torch.tensor(-a * dual_clip, dtype=torch.float64))
            per_token[b, t] = loss
            clipped_count += int(clipped > surrogate)
            total += 1
    return ref_aggregate(per_token, keep, mode), clipped_count / max(total, 1), skipped / mask.shape[0]


POLICY_CASES = [(shape, seed, mode) for shape in SHAPES for seed in (0, 1) for mode in AGGREGATIONS]


@pytest.mark.parametrize(("shape", "seed", "mode"), POLICY_CASES)
@pytest.mark.parametrize(
    ("clip_low", "clip_high", "dual_clip", "skip_threshold"),
    [(0.2, None, None, None), (0.2, 0.28, 3.0, None), (0.1, 0.3, 1.5, 1.5)],
)
def test_policy_loss_matches_loop_value_and_gradient(
    shape, seed, mode, clip_low, clip_high, dual_clip, skip_threshold
):
    gen = torch.Generator().manual_seed(seed)
    mask = holey_mask(*shape, gen)
    old = rand(shape, gen) - 2.0
    logp = (old + rand(shape, gen, 0.6)).requires_grad_(True)
    adv = rand(shape, gen)
    loss, metrics = ppo_policy_loss(
        logp,
        old,
        adv,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        aggregation=mode,
        skip_threshold=skip_threshold,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    logp_ref = logp.detach().clone().requires_grad_(True)
    high = clip_low if clip_high is None else clip_high
    ref, clip_frac, skipped = ref_policy_loss(
        logp_ref, old, adv, mask, clip_low, high, dual_clip, mode, skip_threshold
    )
    torch.testing.assert_close(loss, ref)
    if ref.requires_grad:
        (ref_grad,) = torch.autograd.grad(ref, logp_ref)
        torch.testing.assert_close(grad, ref_grad)
    else:
        assert torch.equal(grad, torch.zeros_like(grad))
    assert metrics["clip_frac"] == pytest.approx(clip_frac)
    assert metrics["skipped_frac"] == pytest.approx(skipped)


def test_policy_loss_hand_worked():
    one = torch.ones(1, 1)
    lp = torch.tensor([[math.log(1.5)]])
    old = torch.zeros(1, 1)
    # ratio 1.5, A = 1: min(1.5, 1.2) -> loss -1.2; clip-higher 0.28 -> -1.28
    loss, metrics = ppo_policy_loss(lp, old, one, one, clip_low=0.2)
    assert loss.item() == pytest.approx(-1.2)
    assert metrics["clip_frac"] == 1.0
    loss, _ = ppo_policy_loss(lp, old, one, one, clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-1.28)
    # ratio 3, A = -1: max(3, 1.2) = 3; dual-clip c = 2 caps it at 2
    lp3 = torch.tensor([[math.log(3.0)]])
    loss, _ = ppo_policy_loss(lp3, old, -one, one)
    assert loss.item() == pytest.approx(3.0)
    loss, metrics = ppo_policy_loss(lp3, old, -one, one, dual_clip=2.0)
    assert loss.item() == pytest.approx(2.0)
    assert metrics["dual_clip_frac"] == 1.0
    # ratio 0.5, A = 1: max(-0.5, -0.8) = -0.5 (the pessimistic branch, unclipped)
    loss, metrics = ppo_policy_loss(torch.tensor([[math.log(0.5)]]), old, one, one)
    assert loss.item() == pytest.approx(-0.5)
    assert metrics["clip_frac"] == 0.0


def test_aggregations_hand_worked():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert aggregate(loss, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(loss, mask, "seq_mean_token_sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    for mode in POLICY_LOSS_AGGREGATIONS:
        assert aggregate(loss, torch.zeros_like(mask), mode).item() == 0.0


def test_skip_threshold_uses_mean_ratio_per_sample():
    """Sample 0: one token at ratio 5 among ratio-1 tokens (mean 2.33) survives threshold 3;
    sample 1: mean ratio 4 is skipped; masked junk (ratio e^20) does not count."""
    logp = torch.log(torch.tensor([[5.0, 1.0, 1.0, 1.0], [4.0, 4.0, 1.0, 1.0]]))
    logp[1, 3] = 40.0
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    adv = torch.ones(2, 4)
    loss, metrics = ppo_policy_loss(logp, torch.zeros(2, 4), adv, mask, skip_threshold=3.0, clip_low=10.0)
    assert metrics["skipped_frac"] == 0.5
    assert loss.item() == pytest.approx(-(5 + 1 + 1) / 3)


def test_all_skipped_gives_zero_loss_with_zero_gradient():
    logp = torch.full((2, 3), 5.0, requires_grad=True)
    loss, metrics = ppo_policy_loss(
        logp, torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3), skip_threshold=2.0
    )
    assert loss.item() == 0.0 and metrics["skipped_frac"] == 1.0
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(2, 3))


# ---------------------------------------------------------------- value loss


def ref_value_loss(values, old, returns, mask, clip, mode):
    per_token, clipped_count, total = {}, 0, 0
    for b in range(mask.shape[0]):
        for t in valid(mask, b):
            v, o, r = values[b, t], float(old[b, t]), float(returns[b, t])
            plain = (v - r) ** 2
            if clip is None:
                per_token[b, t] = 0.5 * plain
                continue
            v_clip = o + torch.clamp(v - o, -clip, clip)
            clipped = (v_clip - r) ** 2
            per_token[b, t] = 0.5 * torch.maximum(plain, clipped)
            clipped_count += int(clipped > plain)
            total += 1
    return ref_aggregate(per_token, mask, mode), clipped_count / max(total, 1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("clip", [None, 0.2])
@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_value_loss_matches_loop(shape, clip, mode):
    gen = torch.Generator().manual_seed(11)
    mask = holey_mask(*shape, gen)
    old = rand(shape, gen)
    values = (old + rand(shape, gen, 0.5)).requires_grad_(True)
    returns = rand(shape, gen)
    loss, metrics = clipped_value_loss(values, old, returns, mask, clip_range=clip, aggregation=mode)
    values_ref = values.detach().clone().requires_grad_(True)
    ref, clip_frac = ref_value_loss(values_ref, old, returns, mask, clip, mode)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(torch.autograd.grad(loss, values)[0], torch.autograd.grad(ref, values_ref)[0])
    assert metrics["vf_clip_frac"] == pytest.approx(clip_frac)


def test_value_loss_hand_worked():
    one = torch.ones(1, 1)
    # V = 2, V_old = 0, R = 1, clip 0.5: plain (2-1)^2 = 1; clipped (0.5-1)^2 = 0.25 -> 0.5 * 1
    loss, _ = clipped_value_loss(2 * one, 0 * one, one, one, clip_range=0.5)
    assert loss.item() == pytest.approx(0.5)
    # V = 2, V_old = 0, R = 3: plain 1; clipped (0.5-3)^2 = 6.25 -> 0.5 * 6.25
    loss, metrics = clipped_value_loss(2 * one, 0 * one, 3 * one, one, clip_range=0.5)
    assert loss.item() == pytest.approx(3.125)
    assert metrics["vf_clip_frac"] == 1.0


# ---------------------------------------------------------------- KL


def ref_kl(lp, ref, name):
    x = ref - lp
    if name == "k3":  # veRL's low_var_kl: x within +-20, the estimate within +-10
        x = max(-20.0, min(20.0, x))
        return max(-10.0, min(10.0, math.exp(x) - x - 1))
    return {"k1": -x, "k2": 0.5 * x * x}[name]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_estimators_match_loop(shape, name):
    gen = torch.Generator().manual_seed(12)
    mask = holey_mask(*shape, gen)
    lp, ref = rand(shape, gen) - 1, rand(shape, gen) - 1
    out = token_kl(lp, ref, mask, name)
    expected = torch.zeros(shape, dtype=torch.float64)
    for b in range(shape[0]):
        for t in valid(mask, b):
            expected[b, t] = ref_kl(float(lp[b, t]), float(ref[b, t]), name)
    torch.testing.assert_close(out, expected)


def test_kl_hand_worked_and_properties():
    lp, ref = torch.tensor([[0.0]]), torch.tensor([[math.log(0.5)]])
    one = torch.ones(1, 1)
    assert token_kl(lp, ref, one, "k1").item() == pytest.approx(math.log(2))
    assert token_kl(lp, ref, one, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert token_kl(lp, ref, one, "k3").item() == pytest.approx(0.5 + math.log(2) - 1)
    gen = torch.Generator().manual_seed(13)
    a, b = rand((50, 4), gen), rand((50, 4), gen)
    assert (token_kl(a, b, torch.ones(50, 4), "k3") >= 0).all()
    assert torch.equal(token_kl(a, a, torch.ones(50, 4), "k3"), torch.zeros(50, 4, dtype=torch.float64))


def test_k3_is_clamped_like_verl_and_stops_the_gradient_beyond():
    """x = ref - logp = 3: e^3 - 4 = 16.09 -> 10; x = -30 -> 30 - 1 = 29 -> 10; x = 2: e^2 - 3 = 4.39 kept."""
    lp = torch.tensor([[0.0, 30.0, 0.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[3.0, 0.0, 2.0]], dtype=torch.float64)
    kl = token_kl(lp, ref, torch.ones(1, 3), "k3")
    torch.testing.assert_close(kl, torch.tensor([[10.0, 10.0, math.exp(2) - 3]], dtype=torch.float64))
    (grad,) = torch.autograd.grad(kl.sum(), lp)
    # d/dlogp (e^x - x - 1) = -(e^x - 1); zero where the clamp holds
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, -(math.exp(2) - 1)]], dtype=torch.float64))


def test_kl_expectation_under_sampling():
    """k1 and k3 are unbiased: averaged over tokens sampled from pi they approach KL(pi || ref)."""
    gen = torch.Generator().manual_seed(14)
    pi = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    exact = float((pi * (pi / ref).log()).sum())
    samples = torch.multinomial(pi, 200_000, replacement=True, generator=gen)
    lp, rlp = pi.log()[samples][None], ref.log()[samples][None]
    mask = torch.ones_like(lp)
    for name in ("k1", "k3"):
        assert token_kl(lp, rlp, mask, name).mean().item() == pytest.approx(exact, abs=0.01)


def test_kl_in_reward_and_in_loss():
    gen = torch.Generator().manual_seed(15)
    mask = holey_mask(4, 6, gen)
    lp = rand((4, 6), gen).requires_grad_(True)
    ref = rand((4, 6), gen)
    rewards = rand((4, 6), gen)
    shaped, metrics = kl_in_reward(rewards, lp, ref, mask, kl_coef=0.1, estimator="k1")
    expected = torch.zeros(4, 6, dtype=torch.float64)
    kls = []
    for b in range(4):
        for t in valid(mask, b):
            kl = ref_kl(float(lp.detach()[b, t]), float(ref[b, t]), "k1")
            expected[b, t] = float(rewards[b, t]) - 0.1 * kl
            kls.append(kl)
    torch.testing.assert_close(shaped, expected)
    assert not shaped.requires_grad
    assert metrics["kl"] == pytest.approx(sum(kls) / len(kls))

    term, metrics = kl_in_loss(lp, ref, mask, kl_coef=0.1, estimator="k3")
    k3s = [ref_kl(float(lp.detach()[b, t]), float(ref[b, t]), "k3") for b in range(4) for t in valid(mask, b)]
    assert term.item() == pytest.approx(0.1 * sum(k3s) / len(k3s))
    term.backward()
    assert lp.grad is not None and torch.equal(lp.grad[mask == 0], torch.zeros_like(lp.grad[mask == 0]))


# ---------------------------------------------------------------- masked positions never leak


def dirty(x, mask, gen):
    junk = torch.randn(x.shape, generator=gen, dtype=x.dtype) * 1e6
    junk.view(-1)[::3] = 1e30
    junk.view(-1)[1::3] = -1e30
    m = mask.bool()
    while m.dim() < x.dim():
        m = m[..., None]
    return torch.where(m, x, junk)


def test_masked_positions_never_leak_into_losses_or_gradients():
    gen = torch.Generator().manual_seed(17)
    shape = (6, 9)
    mask = holey_mask(*shape, gen)
    tensors = {
        "logp": rand(shape, gen) - 2,
        "old": rand(shape, gen) - 2,
        "adv": rand(shape, gen),
        "values": rand(shape, gen),
        "returns": rand(shape, gen),
        "ref": rand(shape, gen) - 2,
    }
    noisy = {k: dirty(v, mask, gen) for k, v in tensors.items()}

    def run(t):
        logp = t["logp"].clone().requires_grad_(True)
        values = t["values"].clone().requires_grad_(True)
        out = {}
        for mode in AGGREGATIONS:
            loss, metrics = ppo_policy_loss(
                logp,
                t["old"],
                t["adv"],
                mask,
                clip_high=0.28,
                dual_clip=3.0,
                aggregation=mode,
                skip_threshold=2.0,
            )
            out[f"pg_{mode}"] = loss
            out.update({f"pg_{mode}_{k}": torch.tensor(v) for k, v in metrics.items()})
        out["vf"], _ = clipped_value_loss(values, t["old"], t["returns"], mask)
        for name in KL_ESTIMATORS:
            out[f"kl_{name}"] = token_kl(logp, t["ref"], mask, name)
            out[f"kl_loss_{name}"], _ = kl_in_loss(logp, t["ref"], mask, kl_coef=0.1, estimator=name)
        out["kl_reward"], _ = kl_in_reward(t["returns"], logp, t["ref"], mask, kl_coef=0.1)
        total = sum(v.sum() for v in out.values() if v.requires_grad)
        grads = torch.autograd.grad(total, (logp, values))
        return out, grads

    clean_out, clean_grads = run(tensors)
    noisy_out, noisy_grads = run(noisy)
    for key, value in clean_out.items():
        torch.testing.assert_close(noisy_out[key], value, rtol=0, atol=0, msg=key)
        assert torch.isfinite(noisy_out[key]).all(), key
    for clean, noisy_grad in zip(clean_grads, noisy_grads, strict=True):
        assert torch.isfinite(noisy_grad).all()
        torch.testing.assert_close(noisy_grad, clean)
    m = mask.bool()
    for key in ("kl_k1", "kl_k2", "kl_k3", "kl_reward"):
        assert torch.equal(noisy_out[key][~m], torch.zeros_like(noisy_out[key][~m])), key
    assert torch.equal(noisy_grads[0][~m], torch.zeros_like(noisy_grads[0][~m]))


# ---------------------------------------------------------------- bad inputs


def test_bad_inputs_are_rejected_with_a_reason():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        ppo_policy_loss(x, x, torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(x, x, x, torch.ones(2, 3), dual_clip=0.5)
    with pytest.raises(ValueError, match="token_mean"):
        ppo_policy_loss(x, x, x, torch.ones(2, 3), aggregation="sum")
    with pytest.raises(ValueError, match="0 or 1"):
        ppo_policy_loss(x, x, x, torch.full((2, 3), 0.5))
    with pytest.raises(ValueError, match="k3"):
        token_kl(x, x, torch.ones(2, 3), "k4")
    with pytest.raises(ValueError, match="clip_range"):
        clipped_value_loss(x, x, x, torch.ones(2, 3), clip_range=-1.0)
