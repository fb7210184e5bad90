"""Statistics an evaluation reports: a success rate's 95% Wilson interval, the unbiased pass@k
estimator over n samples per task, and the paired difference of two policies on the same tasks
with its interval. Pure arithmetic (no torch), so every command and benchmark can share it."""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``n`` (0..1 with no trials): unlike the
    normal approximation it stays inside [0, 1] and is not empty at 0 or n successes."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"wilson(): successes must be in 0..{n}, got {successes}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends, where floats round
    high = 1.0 if successes == n else min(1.0, centre + half)
    return (low, high)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k for one task with ``c`` correct of ``n`` samples (Chen et
    al., 2021): 1 - C(n - c, k) / C(n, k), the chance that k samples drawn without replacement
    hold a correct one. Needs k <= n."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n samples, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k: correct samples must be in 0..{n}, got {c}")
    if n - c < k:
        return 1.0
    # the product form avoids huge binomials: prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def paired_difference(a: Sequence[float], b: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """Mean of a[i] - b[i] over paired tasks, with the normal interval of that mean
    (``z`` x the standard error of the differences): (mean, low, high). Pairing removes the tasks'
    own difficulty from the comparison, so it is tighter than comparing two rates."""
    if len(a) != len(b):
        raise ValueError(f"paired_difference(): {len(a)} and {len(b)} results; pair them by task first")
    n = len(a)
    if n == 0:
        raise ValueError("paired_difference(): no paired tasks")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(diffs) / n
    if n == 1:
        return (mean, -math.inf, math.inf)
    variance = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    half = z * math.sqrt(variance / n)
    return (mean, mean - half, mean + half)
