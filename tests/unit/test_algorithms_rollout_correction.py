"""Rollout/learner mismatch correction against a per-token loop reference and hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from decentralized_verl.algorithms.rollout_correction import RolloutCorrection, correct_rollout

LEVELS = ["off", "token", "sequence"]


def holey_mask(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    mask = (torch.rand(batch, length, generator=gen) < 0.8).double()
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    mask[torch.arange(length)[None, :] >= lengths[:, None]] = 0.0
    mask[0] = 0.0
    mask[-1] = 1.0
    return mask


def valid(mask, b):
    return [t for t in range(mask.shape[1]) if mask[b, t] != 0]


def ref_correction(learner, rollout, mask, c: RolloutCorrection):
    """One token at a time, with Python floats."""
    weights = torch.zeros(mask.shape, dtype=torch.float64)
    kept = torch.zeros(mask.shape, dtype=torch.bool)
    logs, kls, truncated, kept_weights = [], [], [], []
    masked = rejected_rows = rows = 0
    for b in range(mask.shape[0]):
        ts = valid(mask, b)
        if not ts:
            continue
        rows += 1
        log_rho = {t: max(-20.0, min(20.0, float(learner[b, t]) - float(rollout[b, t]))) for t in ts}
        geo = math.exp(sum(log_rho.values()) / len(ts))
        product = math.exp(max(-20.0, min(20.0, sum(log_rho.values()))))
        row_kept = 0
        for t in ts:
            rho = math.exp(log_rho[t])
            logs.append(abs(log_rho[t]))
            kls.append(rho - log_rho[t] - 1)
            if c.rejection == "token":
                keep = c.reject_low <= rho <= c.reject_high
            elif c.rejection == "sequence":
                keep = c.reject_low <= geo <= c.reject_high
            else:
                keep = True
            if not keep:
                masked += 1
                continue
            row_kept += 1
            raw = {"token": rho, "sequence": product, "off": 1.0}[c.importance_sampling]
            kept[b, t] = True
            weights[b, t] = min(raw, c.cap)
            truncated.append(raw > c.cap)
            kept_weights.append(weights[b, t].item())
        rejected_rows += row_kept == 0
    metrics = {
        "abs_log_ratio_mean": sum(logs) / len(logs),
        "abs_log_ratio_max": max(logs),
        "kl": sum(kls) / len(kls),
        "masked_frac": masked / len(logs),
        "rejected_frac": rejected_rows / rows,
        "truncated_frac": sum(truncated) / max(len(truncated), 1),
        "weight_mean": sum(kept_weights) / max(len(kept_weights), 1),
    }
    return weights, kept, metrics


@pytest.mark.parametrize("importance_sampling", LEVELS)
@pytest.mark.parametrize("rejection", LEVELS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correction_matches_loop(importance_sampling, rejection, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (7, 9)
    mask = holey_mask(*shape, gen)
    rollout = torch.randn(*shape, generator=gen, dtype=torch.float64) - 2
    # A mismatch of a few tenths of a nat, with a wild token now and then.
    learner = rollout + 0.3 * torch.randn(*shape, generator=gen, dtype=torch.float64)
    learner[2, 1] += 25.0
    config = RolloutCorrection(
        importance_sampling, cap=1.5, rejection=rejection, reject_low=0.7, reject_high=1.4
    )
    weights, kept, metrics = correct_rollout(learner, rollout, mask, config)
    ref_weights, ref_kept, ref_metrics = ref_correction(learner, rollout, mask, config)
    torch.testing.assert_close(weights, ref_weights)
    assert torch.equal(kept, ref_kept)
    assert metrics == pytest.approx(ref_metrics)


def test_correction_hand_worked():
    """rho = 3, 1.5, 1/4, 1 (log |rho|: 1.10, 0.41, 1.39, 0)."""
    rollout = torch.zeros(1, 4, dtype=torch.float64)
    learner = torch.log(torch.tensor([[3.0, 1.5, 0.25, 1.0]], dtype=torch.float64))
    mask = torch.ones(1, 4)
    weights, kept, metrics = correct_rollout(learner, rollout, mask, RolloutCorrection("token", cap=2.0))
    torch.testing.assert_close(weights, torch.tensor([[2.0, 1.5, 0.25, 1.0]], dtype=torch.float64))
    assert kept.all() and metrics["truncated_frac"] == 0.25 and metrics["masked_frac"] == 0.0
    assert metrics["abs_log_ratio_mean"] == pytest.approx((math.log(3) + math.log(1.5) + math.log(4)) / 4)
    assert metrics["abs_log_ratio_max"] == pytest.approx(math.log(4))
    # IcePop: tokens outside [0.5, 2] leave the loss; the rest keep a weight of 1 (no TIS)
    weights, kept, metrics = correct_rollout(
        learner, rollout, mask, RolloutCorrection("off", rejection="token")
    )
    assert kept.tolist() == [[False, True, False, True]] and metrics["masked_frac"] == 0.5
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0, 0.0, 1.0]], dtype=torch.float64))
    # sequence TIS: the sample's ratio 3 * 1.5 * 0.25 = 1.125 on every token; its geometric mean 1.03 is
    # inside the band, so sequence rejection keeps it
    weights, kept, metrics = correct_rollout(
        learner, rollout, mask, RolloutCorrection("sequence", rejection="sequence")
    )
    torch.testing.assert_close(weights, torch.full((1, 4), 1.125, dtype=torch.float64))
    assert kept.all() and metrics["rejected_frac"] == 0.0


def test_engines_that_agree_change_nothing():
    gen = torch.Generator().manual_seed(3)
    logprobs = torch.randn(4, 5, generator=gen) - 1
    mask = holey_mask(4, 5, gen)
    weights, kept, metrics = correct_rollout(
        logprobs, logprobs.clone(), mask, RolloutCorrection("token", rejection="token")
    )
    assert torch.equal(kept, mask.bool()) and torch.equal(weights, mask.float())
    assert metrics["abs_log_ratio_max"] == 0.0 and metrics["kl"] == 0.0 and metrics["masked_frac"] == 0.0


def test_masked_junk_never_leaks():
    gen = torch.Generator().manual_seed(4)
    mask = holey_mask(5, 6, gen)
    learner = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    rollout = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    dirty_learner = torch.where(mask.bool(), learner, torch.tensor(1e30, dtype=torch.float64))
    dirty_rollout = torch.where(mask.bool(), rollout, torch.tensor(float("nan"), dtype=torch.float64))
    for level in ("token", "sequence"):
        config = RolloutCorrection(level, rejection=level)
        clean = correct_rollout(learner, rollout, mask, config)
        dirty = correct_rollout(dirty_learner, dirty_rollout, mask, config)
        torch.testing.assert_close(dirty[0], clean[0])
        assert torch.equal(dirty[1], clean[1]) and dirty[2] == clean[2]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"importance_sampling": "tokens"}, "importance_sampling: expected off, token or sequence"),
        ({"rejection": "all"}, "rejection: expected"),
        ({"cap": 0.5}, "cap must be >= 1"),
        ({"reject_low": 2.0, "reject_high": 1.5}, "must hold 1"),
        ({"reject_low": 0.0}, "reject_low > 0"),
    ],
)
def test_bad_configs_say_what_is_wrong(kwargs, words):
    with pytest.raises(ValueError, match=words):
        RolloutCorrection(**kwargs)
