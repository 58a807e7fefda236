"""Weights as training changes them, for the delta tests: a small MLP's state after each Adam step."""

from __future__ import annotations

import torch


def trained_states(lr: float, steps: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """State dicts after 0..steps Adam steps of a small MLP on a fixed regression task."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    for p in model.parameters():  # weights of the size a pretrained LM has, not a tiny init
        torch.nn.init.normal_(p, std=0.05)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    states = [{k: v.clone() for k, v in model.state_dict().items()}]
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return states
