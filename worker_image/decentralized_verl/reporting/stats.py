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


def difference_interval(
    before: tuple[int, int], after: tuple[int, int], z: float = Z_95
) -> tuple[float, float]:
    """95% interval of after - before, two proportions given as (successes, n): Newcombe's hybrid score
    interval, built from the two Wilson intervals. It treats the two evaluations as independent; on the
    same held-out problems (paired) that is conservative, so a gain whose interval excludes 0 here is a
    gain."""
    (k1, n1), (k2, n2) = before, after
    p1, p2 = k1 / n1 if n1 else 0.0, k2 / n2 if n2 else 0.0
    l1, u1 = wilson_interval(k1, n1, z)
    l2, u2 = wilson_interval(k2, n2, z)
    d = p2 - p1
    return d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
