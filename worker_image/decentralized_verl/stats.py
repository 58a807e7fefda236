"""Small statistics for reporting results honestly: an accuracy is a count out of n problems."""

from __future__ import annotations

import math

Z_95 = 1.959963984540054
"""The standard normal quantile of a two-sided 95% interval."""


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion: unlike the normal approximation it stays inside
    [0, 1] and keeps its coverage near 0% and 100% accuracy, where small eval sets often sit."""
    if n <= 0:
        raise ValueError(f"n: must be >= 1 (got {n})")
    if not 0 <= successes <= n:
        raise ValueError(f"successes: must be in [0, {n}] (got {successes})")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends, not off by rounding
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high
