"""Advantage estimators against slow per-sample loop references, hand-worked numbers, and leak checks.

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

import math

import pytest
import torch

from decentralized_verl.algorithms import registry
from decentralized_verl.algorithms.advantage_inputs import AdvantageInputs
from decentralized_verl.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    gae,
    grpo,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    rloo,
)
from decentralized_verl.spec.catalogue import algorithms as catalogue

SHAPES = [(4, 1), (6, 5), (9, 13)]


# ---------------------------------------------------------------- random batches


def holey_mask(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """0/1 float mask with right padding, holes in the middle, and one fully masked row."""
    mask = (torch.rand(batch, length, generator=gen) < 0.7).double()
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    mask[torch.arange(length)[None, :] >= lengths[:, None]] = 0.0
    mask[0] = 0.0  # a sample with nothing to train on
    if batch > 1:
        mask[1] = 1.0  # and one fully valid
    return mask


def uneven_groups(batch: int, gen: torch.Generator) -> torch.Tensor:
    """Shuffled, non-contiguous integer ids; sizes differ, and the first group is a lone sample (a group
    of one, as a filter can leave) whenever the batch has room for another group."""
    sizes: list[int] = [1] if batch > 2 else []
    while sum(sizes) < batch:
        sizes.append(int(torch.randint(2, 5, (1,), generator=gen)))
    sizes[-1] -= sum(sizes) - batch
    if sizes[-1] < 2 and len(sizes) > 1:
        last = sizes.pop()
        sizes[-1] += last
    ids = [7 * g + 3 for g, size in enumerate(sizes) for _ in range(size)]
    perm = torch.randperm(batch, generator=gen)
    return torch.tensor(ids)[perm]


def batch_inputs(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "response_mask": holey_mask(batch, length, gen),
        "token_rewards": torch.randn(batch, length, generator=gen, dtype=torch.float64),
        "scores": torch.randn(batch, generator=gen, dtype=torch.float64),
        "values": torch.randn(batch, length, generator=gen, dtype=torch.float64),
        "group_index": uneven_groups(batch, gen),
    }


# ---------------------------------------------------------------- slow references


def valid_positions(mask: torch.Tensor, b: int) -> list[int]:
    return [t for t in range(mask.shape[1]) if mask[b, t] != 0]


def ref_token_rewards(inp: dict, use_tokens: bool) -> list[list[float]]:
    mask = inp["response_mask"]
    out = [[0.0] * mask.shape[1] for _ in range(mask.shape[0])]
    for b in range(mask.shape[0]):
        valid = valid_positions(mask, b)
        if use_tokens:
            for t in valid:
                out[b][t] = float(inp["token_rewards"][b, t])
        elif valid:
            out[b][valid[-1]] = float(inp["scores"][b])
    return out


def ref_sample_scores(inp: dict, use_tokens: bool) -> list[float]:
    mask = inp["response_mask"]
    if not use_tokens:
        return [float(s) for s in inp["scores"]]
    return [
        sum(float(inp["token_rewards"][b, t]) for t in valid_positions(mask, b)) for b in range(len(mask))
    ]


def ref_broadcast(per_sample: list[float], mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for b in range(mask.shape[0]):
        for t in valid_positions(mask, b):
            out[b, t] = per_sample[b]
    return out


def ref_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    vals = [float(x[b, t]) for b in range(mask.shape[0]) for t in valid_positions(mask, b)]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    out = torch.zeros_like(x)
    for b in range(mask.shape[0]):
        for t in valid_positions(mask, b):
            out[b, t] = (float(x[b, t]) - mean) / math.sqrt(var + eps)
    return out


def ref_gae(inp: dict, gamma: float, lam: float, use_tokens: bool):
    mask = inp["response_mask"]
    rewards = ref_token_rewards(inp, use_tokens)
    adv = torch.zeros(mask.shape, dtype=torch.float64)
    ret = torch.zeros(mask.shape, dtype=torch.float64)
    for b in range(mask.shape[0]):
        next_v, next_a = 0.0, 0.0
        for t in reversed(valid_positions(mask, b)):
            v = float(inp["values"][b, t])
            delta = rewards[b][t] + gamma * next_v - v
            a = delta + gamma * lam * next_a
            adv[b, t], ret[b, t] = a, a + v
            next_v, next_a = v, a
    return adv, ret


def ref_discounted(inp: dict, gamma: float, use_tokens: bool) -> torch.Tensor:
    mask = inp["response_mask"]
    rewards = ref_token_rewards(inp, use_tokens)
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for b in range(mask.shape[0]):
        running = 0.0
        for t in reversed(valid_positions(mask, b)):
            running = rewards[b][t] + gamma * running
            out[b, t] = running
    return out


def members(groups: torch.Tensor, i: int) -> list[int]:
    return [j for j in range(len(groups)) if groups[j] == groups[i]]


def ref_grpo(inp: dict, norm_by_std: bool, eps: float, use_tokens: bool) -> torch.Tensor:
    scores = ref_sample_scores(inp, use_tokens)
    per_sample = []
    for i in range(len(scores)):
        group = [scores[j] for j in members(inp["group_index"], i)]
        mean = sum(group) / len(group) if len(group) > 1 else 0.0  # a lone sample: mean 0, std 1
        value = scores[i] - mean
        if norm_by_std:
            std = math.sqrt(sum((s - mean) ** 2 for s in group) / (len(group) - 1)) if len(group) > 1 else 1.0
            value /= std + eps
        per_sample.append(value)
    return ref_broadcast(per_sample, inp["response_mask"])


def ref_rloo(inp: dict, use_tokens: bool) -> torch.Tensor:
    scores = ref_sample_scores(inp, use_tokens)
    per_sample = []
    for i in range(len(scores)):
        others = [scores[j] for j in members(inp["group_index"], i) if j != i]
        per_sample.append(scores[i] - (sum(others) / len(others) if others else 0.0))
    return ref_broadcast(per_sample, inp["response_mask"])


def ref_rpp_baseline(inp: dict, eps: float, use_tokens: bool) -> torch.Tensor:
    scores = ref_sample_scores(inp, use_tokens)
    per_sample = []
    for i in range(len(scores)):
        group = [scores[j] for j in members(inp["group_index"], i)]
        per_sample.append(scores[i] - (sum(group) / len(group) if len(group) > 1 else 0.0))
    return ref_whiten(ref_broadcast(per_sample, inp["response_mask"]), inp["response_mask"], eps)


def make(inp: dict, use_tokens: bool) -> AdvantageInputs:
    fields = dict(inp)
    if use_tokens:
        fields.pop("scores")
    else:
        fields.pop("token_rewards")
    return AdvantageInputs(**fields)


# ---------------------------------------------------------------- comparisons

CASES = [(shape, seed, use_tokens) for shape in SHAPES for seed in (0, 1) for use_tokens in (False, True)]


@pytest.mark.parametrize(("shape", "seed", "use_tokens"), CASES)
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)])
def test_gae_matches_loop(shape, seed, use_tokens, gamma, lam):
    inp = batch_inputs(*shape, seed)
    adv, ret = gae(make(inp, use_tokens), gamma=gamma, lam=lam)
    ref_adv, ref_ret = ref_gae(inp, gamma, lam, use_tokens)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)


@pytest.mark.parametrize(("shape", "seed", "use_tokens"), CASES)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_loop(shape, seed, use_tokens, norm_by_std):
    inp = batch_inputs(*shape, seed)
    adv, ret = grpo(make(inp, use_tokens), norm_by_std=norm_by_std, epsilon=1e-6)
    expected = ref_grpo(inp, norm_by_std, 1e-6, use_tokens)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


@pytest.mark.parametrize(("shape", "seed", "use_tokens"), CASES)
def test_rloo_matches_loop(shape, seed, use_tokens):
    inp = batch_inputs(*shape, seed)
    adv, _ = rloo(make(inp, use_tokens))
    torch.testing.assert_close(adv, ref_rloo(inp, use_tokens))


@pytest.mark.parametrize(("shape", "seed", "use_tokens"), CASES)
@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_reinforce_plus_plus_matches_loop(shape, seed, use_tokens, gamma):
    inp = batch_inputs(*shape, seed)
    adv, ret = reinforce_plus_plus(make(inp, use_tokens), gamma=gamma, epsilon=1e-8)
    expected_ret = ref_discounted(inp, gamma, use_tokens)
    torch.testing.assert_close(ret, expected_ret)
    torch.testing.assert_close(adv, ref_whiten(expected_ret, inp["response_mask"], 1e-8))


@pytest.mark.parametrize(("shape", "seed", "use_tokens"), CASES)
def test_reinforce_plus_plus_baseline_matches_loop(shape, seed, use_tokens):
    inp = batch_inputs(*shape, seed)
    adv, _ = reinforce_plus_plus_baseline(make(inp, use_tokens), epsilon=1e-8)
    torch.testing.assert_close(adv, ref_rpp_baseline(inp, 1e-8, use_tokens))


# ---------------------------------------------------------------- hand-worked examples


def test_gae_hand_worked():
    mask = torch.ones(1, 3)
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.full((1, 3), 0.5, dtype=torch.float64)
    inputs = AdvantageInputs(response_mask=mask, token_rewards=rewards, values=values)
    adv, ret = gae(inputs, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5]], dtype=torch.float64))
    torch.testing.assert_close(ret, torch.ones(1, 3, dtype=torch.float64))
    # gamma = lam = 0.5: delta = [-0.25, -0.25, 0.5]; A2 = 0.5,
    # A1 = -0.25 + 0.25 * 0.5 = -0.125, A0 = -0.25 + 0.25 * A1 = -0.28125
    adv, _ = gae(inputs, gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.28125, -0.125, 0.5]], dtype=torch.float64))


def test_gae_skips_holes():
    """A hole between two valid tokens is as if it were not there (values carry across it)."""
    values = torch.tensor([[0.5, 123.0, 0.5, 0.5]], dtype=torch.float64)
    rewards = torch.tensor([[0.0, 99.0, 0.0, 1.0]], dtype=torch.float64)
    holey = AdvantageInputs(torch.tensor([[1.0, 0.0, 1.0, 1.0]]), token_rewards=rewards, values=values)
    adv, _ = gae(holey, gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.28125, 0.0, -0.125, 0.5]], dtype=torch.float64))


def test_grpo_and_dr_grpo_hand_worked():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0], dtype=torch.float64)
    inputs = AdvantageInputs(torch.ones(6, 2), scores=scores, group_index=torch.tensor([0, 0, 0, 0, 5, 5]))
    adv, _ = grpo(inputs, epsilon=0.0)
    s = math.sqrt(3) / 2  # 0.5 / sqrt(1/3)
    h = math.sqrt(2) / 2  # 1 / sqrt(2)
    torch.testing.assert_close(adv[:, 0], torch.tensor([s, -s, -s, s, -h, h], dtype=torch.float64))
    adv, _ = grpo(inputs, norm_by_std=False)
    torch.testing.assert_close(
        adv[:, 1], torch.tensor([0.5, -0.5, -0.5, 0.5, -1.0, 1.0], dtype=torch.float64)
    )


def test_grpo_constant_group_is_zero_not_nan():
    inputs = AdvantageInputs(
        torch.ones(3, 2), scores=torch.ones(3), group_index=torch.zeros(3, dtype=torch.long)
    )
    adv, _ = grpo(inputs)
    assert torch.equal(adv, torch.zeros(3, 2))


def test_rloo_hand_worked():
    inputs = AdvantageInputs(
        torch.ones(3, 1), scores=torch.tensor([1.0, 0.0, 0.0]), group_index=torch.zeros(3).long()
    )
    adv, _ = rloo(inputs)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -0.5, -0.5]))


def test_reinforce_plus_plus_places_score_on_last_valid_token():
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0]])
    inputs = AdvantageInputs(mask, scores=torch.tensor([2.0], dtype=torch.float64))
    _, returns = reinforce_plus_plus(inputs, gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.5, 1.0, 0.0, 2.0, 0.0]], dtype=torch.float64))


# ---------------------------------------------------------------- masked positions never leak


def junk_like(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    junk = torch.randn(x.shape, generator=gen, dtype=torch.float64) * 1e6
    junk[..., ::2] = 1e30
    return junk.to(x.dtype)


@pytest.mark.parametrize("name", sorted(catalogue.ADVANTAGE_ESTIMATOR_NAMES))
@pytest.mark.parametrize("use_tokens", [False, True])
def test_masked_positions_never_leak(name, use_tokens):
    inp = batch_inputs(7, 9, seed=3)
    mask = inp["response_mask"].bool()
    gen = torch.Generator().manual_seed(9)
    dirty = dict(inp)
    for key in ("token_rewards", "values"):
        dirty[key] = torch.where(mask, inp[key], junk_like(inp[key], gen))
    hparams = {"gamma": 0.9, "lam": 0.95}
    clean_out = ADVANTAGE_ESTIMATORS[name](make(inp, use_tokens), **hparams)
    dirty_out = ADVANTAGE_ESTIMATORS[name](make(dirty, use_tokens), **hparams)
    for clean, noisy in zip(clean_out, dirty_out, strict=True):
        assert torch.equal(clean, noisy)
        assert torch.isfinite(noisy).all()
        assert torch.equal(noisy[~mask], torch.zeros_like(noisy[~mask]))


def test_bool_and_float_masks_agree():
    inp = batch_inputs(6, 5, seed=4)
    as_bool = dict(inp, response_mask=inp["response_mask"].bool())
    for name in ADVANTAGE_ESTIMATORS:
        a = ADVANTAGE_ESTIMATORS[name](make(inp, True))
        b = ADVANTAGE_ESTIMATORS[name](make(as_bool, True))
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------- registry and blind calls


def test_every_declared_name_has_a_function_and_presets_use_declared_names():
    registry.load()
    assert set(registry.ADVANTAGE_ESTIMATORS) == set(catalogue.ADVANTAGE_ESTIMATOR_NAMES)
    assert set(registry.POLICY_LOSSES) == set(catalogue.POLICY_LOSS_NAMES)
    assert set(registry.POLICY_LOSS_AGGREGATIONS) == set(catalogue.LOSS_AGGREGATION_NAMES)
    assert set(registry.KL_ESTIMATORS) == set(catalogue.KL_ESTIMATOR_NAMES)
    for preset in catalogue.PRESETS.values():
        assert preset.advantage_estimator in registry.ADVANTAGE_ESTIMATORS
        assert preset.policy_loss in registry.POLICY_LOSSES
        assert preset.loss_aggregation in registry.POLICY_LOSS_AGGREGATIONS


def test_a_function_under_an_undeclared_name_is_refused():
    with pytest.raises(ValueError, match=r"policy loss 'mystery' is not in the catalogue"):
        registry.policy_loss("mystery")(lambda *a, **k: None)
    registry.load()
    with pytest.raises(ValueError, match="registered twice"):
        registry.policy_loss("ppo_clip")(lambda *a, **k: None)


def test_blind_call_with_shared_hparams():
    """One hparams dict for every estimator: each takes what it names, ignores the rest."""
    inp = batch_inputs(6, 4, seed=5)
    hparams = {"gamma": 0.9, "lam": 0.8, "norm_by_std": False, "epsilon": 1e-6}
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        adv, ret = fn(make(inp, use_tokens=True), **hparams)
        assert adv.shape == ret.shape == inp["response_mask"].shape, name
    adv, _ = ADVANTAGE_ESTIMATORS["grpo"](make(inp, True), **hparams)
    torch.testing.assert_close(adv, ref_grpo(inp, False, 1e-6, True))
    adv, _ = ADVANTAGE_ESTIMATORS["gae"](make(inp, True), **hparams)
    torch.testing.assert_close(adv, ref_gae(inp, 0.9, 0.8, True)[0])


def test_unknown_hparam_is_an_error():
    inp = batch_inputs(4, 3, seed=6)
    with pytest.raises(TypeError, match="gama"):
        ADVANTAGE_ESTIMATORS["grpo"](make(inp, False), gama=0.9)


def test_unknown_estimator_name_lists_known():
    with pytest.raises(ValueError, match="rloo"):
        registry.lookup(registry.ADVANTAGE_ESTIMATORS, "advantage estimator", "ppo2")


# ---------------------------------------------------------------- bad inputs


def test_a_group_of_one_gets_mean_0_and_std_1():
    """Group 4 = {1, 3}: mean 2, unbiased std sqrt(2); group 9's lone sample (score 5) keeps its score."""
    inputs = AdvantageInputs(
        torch.ones(3, 2), scores=torch.tensor([1.0, 3.0, 5.0]), group_index=torch.tensor([4, 4, 9])
    )
    adv, _ = grpo(inputs, epsilon=0.0)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-1 / math.sqrt(2), 1 / math.sqrt(2), 5.0]))
    adv, _ = grpo(inputs, norm_by_std=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-1.0, 1.0, 5.0]))
    adv, _ = rloo(inputs)  # leave-one-out: 1 - 3, 3 - 1, and no others for the lone sample
    torch.testing.assert_close(adv[:, 0], torch.tensor([-2.0, 2.0, 5.0]))
    adv, _ = reinforce_plus_plus_baseline(inputs)  # centred (-1, 1, 5) per token, then whitened
    centred = torch.tensor([-1.0, 1.0, 5.0]).repeat_interleave(2)
    expected = (centred - centred.mean()) / torch.sqrt(centred.var() + 1e-8)
    torch.testing.assert_close(adv.flatten(), expected)
    for fn in (grpo, rloo, reinforce_plus_plus_baseline):
        assert torch.isfinite(
            fn(AdvantageInputs(torch.ones(1, 2), scores=torch.ones(1), group_index=torch.zeros(1).long()))[0]
        ).all()


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        (AdvantageInputs(torch.ones(2, 3), scores=torch.zeros(2)), "group_index"),
        (AdvantageInputs(torch.ones(2, 3), group_index=torch.zeros(2).long()), "token_rewards or scores"),
        (
            AdvantageInputs(torch.ones(2, 3), scores=torch.zeros(3), group_index=torch.zeros(3).long()),
            "scores",
        ),
        (AdvantageInputs(torch.ones(2, 3), scores=torch.zeros(2), group_index=torch.zeros(2)), "integer"),
        (
            AdvantageInputs(
                torch.full((2, 3), 2.0), scores=torch.zeros(2), group_index=torch.zeros(2).long()
            ),
            "0 or 1",
        ),
        (
            AdvantageInputs(
                torch.ones(2, 3), token_rewards=torch.zeros(2, 4), group_index=torch.zeros(2).long()
            ),
            "shape",
        ),
    ],
)
def test_bad_inputs_name_the_field(inputs, match):
    with pytest.raises(ValueError, match=match):
        grpo(inputs)


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        gae(AdvantageInputs(torch.ones(2, 3), token_rewards=torch.zeros(2, 3)))
