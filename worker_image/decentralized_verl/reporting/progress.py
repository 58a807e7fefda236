"""One plain line per training step (step, reward, accuracy, tokens/s, ETA), for logs and pipes.

A progress bar is only for a terminal; a pod log, CI or a redirected `dverl run` needs a line a person
can read and `grep` later. Pure functions: the learner logs the line, `dverl run` prints it when stderr
is not a TTY, `dverl status` shows the same numbers.
"""

from __future__ import annotations

import math


def format_duration(seconds: float | None) -> str:
    """`1h02m`, `3m05s`, `42s`; `?` while unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def eta_seconds(step: int, total: int, elapsed_s: float, first_step: int = 0) -> float | None:
    """Seconds left at the pace of the steps done since `first_step` (a resumed run's start)."""
    done = step - first_step
    if done <= 0 or total <= 0 or elapsed_s <= 0:
        return None
    return max(total - step, 0) * elapsed_s / done


def progress_line(
    step: int,
    total: int,
    reward: float | None,
    tokens_per_second: float | None,
    eta_s: float | None,
    accuracy: float | None = None,
) -> str:
    """`step 12/200 reward 0.412 acc 55.0% tok/s 1830 eta 3m05s`; accuracy only on evaluated steps."""
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    if reward is not None:
        parts.append(f"reward {reward:.3f}")
    if accuracy is not None:
        parts.append(f"acc {100 * accuracy:.1f}%")
    if tokens_per_second is not None:
        parts.append(f"tok/s {tokens_per_second:.0f}")
    parts.append(f"eta {format_duration(eta_s)}")
    return " ".join(parts)
