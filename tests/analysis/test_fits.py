"""fits.py on synthetic data with a known law."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from runner.analysis.fits import fit_laws, linear_fit

DEPTHS = [2, 4, 6, 8, 12, 16, 24, 32]


def test_exact_linear_law_is_recovered():
    ys = [3.0 * n + 2.0 for n in DEPTHS]
    laws = fit_laws(DEPTHS, ys)
    assert laws["N"]["slope"] == pytest.approx(3.0)
    assert laws["N"]["intercept"] == pytest.approx(2.0)
    assert laws["N"]["r2"] == pytest.approx(1.0)
    assert laws["logN"]["r2"] < 0.95  # a straight line in N is not one in log N


def test_exact_log_law_is_recovered():
    ys = [2.0 * math.log(n) + 1.0 for n in DEPTHS]
    laws = fit_laws(DEPTHS, ys)
    assert laws["logN"]["slope"] == pytest.approx(2.0)
    assert laws["logN"]["intercept"] == pytest.approx(1.0)
    assert laws["logN"]["r2"] == pytest.approx(1.0)
    assert laws["N"]["r2"] < 0.95


def test_power_exponent():
    laws = fit_laws(DEPTHS, [5.0 * n ** 0.5 for n in DEPTHS])
    assert laws["power"]["exponent"] == pytest.approx(0.5)
    assert laws["power"]["coefficient"] == pytest.approx(5.0)
    assert fit_laws(DEPTHS, [1.0, -1.0] * 4)["power"] is None


def test_noisy_fit_matches_numpy():
    rng = random.Random(0)
    xs = [float(n) for n in DEPTHS]
    ys = [0.7 * x + 3 + rng.gauss(0, 2.0) for x in xs]
    fit = linear_fit(xs, ys)
    slope, intercept = np.polyfit(xs, ys, 1)
    assert fit.slope == pytest.approx(slope) and fit.intercept == pytest.approx(intercept)
    # simple regression: R^2 is the squared Pearson correlation
    assert fit.r2 == pytest.approx(np.corrcoef(xs, ys)[0, 1] ** 2)
    assert 0 < fit.r2 < 1
    assert fit.predict(10.0) == pytest.approx(slope * 10 + intercept)


def test_bad_input():
    with pytest.raises(ValueError):
        linear_fit([1.0], [2.0])
    with pytest.raises(ValueError):
        linear_fit([1.0, 1.0], [2.0, 3.0])
