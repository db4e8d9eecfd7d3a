"""Least-squares laws for the output-change curves (Admin paper, Fig. 4 / Corollaries 1-2:
Post-LN's change ~ N, Pre-LN's ~ log N, each reported with R^2)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence


@dataclass(frozen=True)
class Fit:
    slope: float
    intercept: float
    r2: float  # coefficient of determination of y against the fitted line (1 = exact)

    def predict(self, x: float) -> float:
        return self.slope * x + self.intercept


def linear_fit(x: Sequence[float], y: Sequence[float]) -> Fit:
    """Ordinary least squares y = slope * x + intercept."""
    n = len(x)
    if n != len(y) or n < 2:
        raise ValueError("linear_fit needs two sequences of equal length >= 2")
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0:
        raise ValueError("linear_fit: all x are equal")
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((b - my) ** 2 for b in y)
    ss_res = sum((b - (slope * a + intercept)) ** 2 for a, b in zip(x, y))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return Fit(slope, intercept, r2)


def fit_laws(depths: Sequence[float], values: Sequence[float]) -> dict:
    """The two laws the paper tests (y = a*N + b and y = a*log N + b) and, as a neutral
    description of the curve's shape, the power-law exponent p of y = c*N^p (a straight line in
    log-log; p = 1 is linear, p < 1 sublinear). The power fit needs positive values."""
    out = {"N": asdict(linear_fit(depths, values)),
           "logN": asdict(linear_fit([math.log(d) for d in depths], values))}
    if all(v > 0 for v in values):
        power = linear_fit([math.log(d) for d in depths], [math.log(v) for v in values])
        out["power"] = {"exponent": power.slope, "coefficient": math.exp(power.intercept),
                        "r2": power.r2}
    else:
        out["power"] = None
    return out
