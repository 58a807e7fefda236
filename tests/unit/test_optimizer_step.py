"""One optimizer step for every trainer: it equals clip + step + schedule written out by hand, drops a
non-finite gradient when asked, and is the only place in the package that clips or steps an optimizer."""

from __future__ import annotations

import ast
import math

import pytest
import torch

from decentralized_verl.training.optimizer_step import StepOutcome, optimizer_step
from tests.support.paths import ROOT

PACKAGE = ROOT / "worker_image" / "decentralized_verl"
HOME = "training/optimizer_step.py"
TRAINERS = (
    "training/trainer.py",
    "serving/scoring.py",
    "stages/common.py",
    "entrypoints/volunteer_learner.py",
)


def _model_with_grads(seed: int) -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.01)
    x = torch.randn(5, 4)
    (model(x) ** 2).sum().mul(10).backward()  # large gradients: clipping bites
    return model, optimizer


def test_the_step_equals_clip_step_and_schedule_by_hand() -> None:
    ours, ours_opt = _model_with_grads(0)
    hand, hand_opt = _model_with_grads(0)
    ours_sched = torch.optim.lr_scheduler.LambdaLR(ours_opt, lambda step: (step + 1) / 4)
    hand_sched = torch.optim.lr_scheduler.LambdaLR(hand_opt, lambda step: (step + 1) / 4)

    outcome = optimizer_step(ours_opt, ours.parameters(), max_grad_norm=0.5, scheduler=ours_sched)

    expected = float(torch.nn.utils.clip_grad_norm_(list(hand.parameters()), 0.5))
    hand_opt.step()
    hand_sched.step()
    assert outcome == StepOutcome(pytest.approx(expected)) and expected > 0.5
    for a, b in zip(ours.parameters(), hand.parameters(), strict=True):
        assert torch.equal(a, b)
    assert ours_sched.get_last_lr() == hand_sched.get_last_lr() == [0.1 * 2 / 4]
    assert all(p.grad is not None for p in ours.parameters())  # kept unless asked to clear


def test_without_clipping_the_gradient_is_applied_as_it_is() -> None:
    ours, ours_opt = _model_with_grads(1)
    hand, hand_opt = _model_with_grads(1)
    assert optimizer_step(ours_opt, ours.parameters(), max_grad_norm=None, clear_grads=True) == StepOutcome(
        None
    )
    hand_opt.step()
    for a, b in zip(ours.parameters(), hand.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(p.grad is None for p in ours.parameters())


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_a_non_finite_gradient_is_dropped_when_asked(bad: float) -> None:
    model, optimizer = _model_with_grads(2)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    model.weight.grad[0, 0] = bad
    outcome = optimizer_step(
        optimizer, model.parameters(), max_grad_norm=1.0, scheduler=sched, skip_nonfinite=True
    )
    assert outcome.skipped and not math.isfinite(outcome.grad_norm)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters()) and sched.last_epoch == 0
    # Not asked: the caller accepts the step as it comes (the weights change, NaN or not).
    model.weight.grad = torch.full_like(model.weight, bad)
    model.bias.grad = torch.zeros_like(model.bias)
    assert not optimizer_step(optimizer, model.parameters(), max_grad_norm=1.0).skipped


def _steps_and_clips(tree: ast.AST) -> list[int]:
    """Lines that clip gradients or call `<something optimizer-like>.step()` outside the shared step."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        target = node.func.value
        name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
        if node.func.attr.startswith("clip_grad") or (
            node.func.attr == "step" and ("optim" in name or name in ("sgd", "adam", "adamw"))
        ):
            lines.append(node.lineno)
    return lines


def test_every_trainer_goes_through_the_one_step() -> None:
    for module in TRAINERS:
        tree = ast.parse((PACKAGE / module).read_text())
        called = {
            n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        assert "optimizer_step" in called, f"{module} does not use training/optimizer_step.py"
    elsewhere = {
        path.relative_to(PACKAGE).as_posix(): lines
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).as_posix() != HOME
        and (lines := _steps_and_clips(ast.parse(path.read_text())))
    }
    assert elsewhere == {}, "clip and step in training/optimizer_step.py only"


def test_the_scan_sees_a_hand_written_step() -> None:
    code = "optimizer.step()\nself.optimizer.step()\nsgd.step()\ntorch.nn.utils.clip_grad_norm_(p, 1)\n"
    assert _steps_and_clips(ast.parse(code)) == [1, 2, 3, 4]
    assert _steps_and_clips(ast.parse("scheduler.step()\nloop.step()\n")) == []
