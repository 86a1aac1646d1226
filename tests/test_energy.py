"""Energy analysis on synthetic sensor signals with known integrals."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from perfzoo import energy
from perfzoo.plotting import save_figure
from perfzoo.report import energy as energy_figures
from perfzoo.io import InputError


def _samples(
    t_s: np.ndarray, power_w: np.ndarray, limit_w: float = 250.0, repeat: int = 0, t0_ns: int = 10**12
) -> pd.DataFrame:
    """A sensor table for one run: timestamps in ns with an arbitrary wall-clock offset."""
    return pd.DataFrame(
        {
            "model_id": "m1",
            "mode": "training",
            "batch": 32,
            "repeat": repeat,
            "t_ns": (t0_ns + np.round(np.asarray(t_s) * 1e9)).astype("int64"),
            "power_w": power_w,
            "power_limit_w": limit_w,
        }
    )


def test_constant_power_integrates_to_power_times_duration() -> None:
    t = np.linspace(0.0, 3.0, 151)  # 50 Hz for 3 s
    t_ns = (t * 1e9).astype("int64") + 123_456_789
    for method in ("rectangle", "trapezoid"):
        e = energy.energy_from_samples(t_ns, np.full_like(t, 200.0), method=method)
        assert e == pytest.approx(600.0, rel=0.005)


def test_ramp_trapezoid_exact_and_rectangle_within_half_step_bound() -> None:
    t = np.linspace(0.0, 2.0, 41)  # dt = 0.05 s, P from 100 W to 300 W
    p = 100.0 + 100.0 * t
    exact = 100.0 * 2.0 + 50.0 * 2.0**2  # ∫ (100 + 100 t) dt = 400 J
    t_ns = t * 1e9
    assert energy.energy_from_samples(t_ns, p, method="trapezoid") == pytest.approx(exact, rel=1e-9)
    rect = energy.energy_from_samples(t_ns, p, method="rectangle")
    # left rectangle under-estimates a rising ramp by slope * T * dt / 2 = 100 * 2 * 0.05 / 2 = 5 J
    assert rect == pytest.approx(exact - 5.0, rel=1e-9)


def test_nan_power_is_skipped_not_counted_as_zero() -> None:
    t = np.linspace(0.0, 3.0, 151)
    p = np.full_like(t, 200.0)
    p[40:60] = np.nan
    assert energy.energy_from_samples(t * 1e9, p) == pytest.approx(600.0, rel=0.005)


def test_cumulative_energy_ends_at_total() -> None:
    t = np.linspace(0.0, 2.0, 41)
    p = 100.0 + 100.0 * t
    curve = energy.cumulative_energy(t, p)
    assert curve[0] == 0.0
    assert np.all(np.diff(curve) > 0)
    assert curve[-1] == pytest.approx(energy.energy_from_samples(t * 1e9, p))


def test_relative_time_starts_at_zero_per_run() -> None:
    a = _samples(np.array([0.0, 0.5, 1.0]), np.array([1.0, 1.0, 1.0]), repeat=0, t0_ns=5 * 10**12)
    b = _samples(np.array([0.0, 0.25]), np.array([1.0, 1.0]), repeat=1, t0_ns=9 * 10**12)
    rel = energy.relative_time(pd.concat([a, b]))
    assert rel.groupby("run")["t_s"].min().tolist() == [0.0, 0.0]
    assert rel.groupby("run")["t_s"].max().tolist() == [1.0, 0.25]


def test_runs_split_by_power_limit_even_with_same_repeat_index() -> None:
    t = np.linspace(0.0, 1.0, 11)
    low = _samples(t, np.full_like(t, 150.0), limit_w=150.0, t0_ns=10**12)
    high = _samples(t, np.full_like(t, 250.0), limit_w=250.0, t0_ns=2 * 10**12)
    high.loc[3, "power_limit_w"] = np.nan  # a failed limit read must not split the run
    runs = energy.run_energy(pd.concat([low, high]))
    assert sorted(runs["limit_w"]) == [150.0, 250.0]
    assert runs.set_index("limit_w")["energy_j"].to_dict() == pytest.approx({150.0: 150.0, 250.0: 250.0})
    assert runs["edp_js"].tolist() == pytest.approx((runs["energy_j"] * runs["duration_s"]).tolist())


def test_resample_cubic_reproduces_a_cubic_at_4hz() -> None:
    t = np.sort(np.random.default_rng(0).uniform(0.0, 5.0, 200))
    t[0] = 0.0
    grid, values = energy.resample_cubic(t, 2.0 + 0.5 * t**3 - t**2)
    assert np.allclose(np.diff(grid), 0.25)
    assert grid[0] == 0.0 and grid[-1] <= t[-1]
    assert np.allclose(values, 2.0 + 0.5 * grid**3 - grid**2, atol=1e-6)


def test_masked_mean_sd_over_unequal_lengths() -> None:
    series = [np.array([1.0, 2.0, 3.0, 4.0]), np.array([3.0, 4.0]), np.array([5.0, 6.0, 9.0])]
    mean, sd, count = energy.masked_mean_sd(series)
    assert count.tolist() == [3, 3, 2, 1]
    assert mean.tolist() == pytest.approx([3.0, 4.0, 6.0, 4.0])
    assert sd[:3] == pytest.approx([2.0, 2.0, np.std([3.0, 9.0], ddof=1)])
    assert np.isnan(sd[3])  # one signal left: no sample sd, and padding never enters the mean


def test_cumulative_energy_curves_average_repetitions() -> None:
    frames = []
    for rep, (seconds, watts) in enumerate([(4.0, 100.0), (2.0, 300.0)]):
        t = np.linspace(0.0, seconds, int(seconds * 50) + 1)
        frames.append(
            _samples(t, np.full_like(t, watts), limit_w=200.0, repeat=rep, t0_ns=(rep + 1) * 10**12)
        )
    curves = energy.cumulative_energy_curves(pd.concat(frames))
    at_1s = curves[curves["t_s"] == 1.0].iloc[0]
    assert at_1s["energy_mean_j"] == pytest.approx(200.0)  # (100 + 300) / 2
    assert at_1s["n_runs"] == 2
    at_3s = curves[curves["t_s"] == 3.0].iloc[0]
    assert at_3s["energy_mean_j"] == pytest.approx(300.0) and at_3s["n_runs"] == 1


def test_quadratic_fit_recovers_coefficients() -> None:
    x = np.array([150.0, 200.0, 250.0, 300.0, 350.0])
    fit = energy.quadratic_fit(x, 0.01 * x**2 - 3.0 * x + 500.0)
    assert (fit.a, fit.b, fit.c) == pytest.approx((0.01, -3.0, 500.0), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)
    noisy = energy.quadratic_fit(
        x, 0.01 * x**2 - 3.0 * x + 500.0 + np.array([30.0, -30.0, 30.0, -30.0, 30.0])
    )
    assert noisy.r2 < 0.99
    assert np.isnan(energy.quadratic_fit([1.0, 2.0], [1.0, 2.0]).r2)


def test_summary_and_fits_vs_limit() -> None:
    frames = []
    for i, limit in enumerate([150.0, 200.0, 250.0, 300.0]):
        duration = 1000.0 / limit  # faster at higher limits, constant power = limit -> E = 1000 J
        for rep in range(2):
            t = np.linspace(0.0, duration, 60)
            frames.append(
                _samples(
                    t, np.full_like(t, limit), limit_w=limit, repeat=rep, t0_ns=(10 * i + rep + 1) * 10**12
                )
            )
    runs = energy.run_energy(pd.concat(frames))
    summary = energy.summarize_vs_limit(runs)
    assert summary["n_runs"].tolist() == [2, 2, 2, 2]
    assert summary["energy_j_mean"].tolist() == pytest.approx([1000.0] * 4)
    fits = energy.fits_vs_limit(summary).set_index("metric")
    assert fits.loc["energy_j", "a"] == pytest.approx(0.0, abs=1e-9)
    assert fits.loc["duration_s", "r2"] > 0.98


def test_sampling_jitter_statistics() -> None:
    rng = np.random.default_rng(1)
    intervals = rng.normal(0.02, 0.0005, 500)
    t = np.concatenate([[0.0], np.cumsum(intervals)])
    stats = energy.sampling_jitter(_samples(t, np.ones_like(t)), bins=20)
    freq = 1.0 / np.diff(np.round(t * 1e9) / 1e9)
    assert stats["n"] == 500
    assert stats["mean_hz"] == pytest.approx(freq.mean(), rel=1e-9)
    assert stats["cv"] == pytest.approx(freq.std(ddof=1) / freq.mean(), rel=1e-9)
    assert stats["counts"].sum() == 500 and len(stats["edges"]) == 21


def test_compare_counter() -> None:
    assert energy.compare_counter(100.0, 103.0) == pytest.approx(0.03)
    assert np.isnan(energy.compare_counter(float("nan"), 10.0))
    assert np.isnan(energy.compare_counter(0.0, 10.0))


def test_figures_written_atomically_and_deterministically(tmp_path) -> None:
    frames = []
    for i, limit in enumerate([150.0, 250.0, 300.0]):
        for rep in range(2):
            t = np.linspace(0.0, 2.0 + 0.3 * rep, 80)
            p = np.minimum(limit, 200.0 + 80.0 * np.sin(5 * t))
            frames.append(_samples(t, p, limit_w=limit, repeat=rep, t0_ns=(10 * i + rep + 1) * 10**12))
    samples = pd.concat(frames)
    summary = energy.summarize_vs_limit(energy.run_energy(samples))

    def render(folder):  # each figure as PNG and PDF, written by the one figure saver
        return [
            *save_figure(energy_figures.plot_power_over_time(samples), folder / "power.png"),
            *save_figure(energy_figures.plot_cumulative_energy(samples), folder / "cumulative.png"),
            *save_figure(energy_figures.plot_metrics_vs_limit(summary), folder / "vs_limit.png"),
            *save_figure(energy_figures.plot_sampling_jitter(samples), folder / "jitter.png"),
        ]

    first, second = render(tmp_path / "a"), render(tmp_path / "b")
    for a, b in zip(first, second, strict=True):
        assert a.stat().st_size > 1000
        assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest(), a.name
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(
        p.name for p in first
    )  # no temp files left


def test_plot_rejects_several_configurations(tmp_path) -> None:
    t = np.linspace(0.0, 1.0, 10)
    a = _samples(t, np.ones_like(t))
    b = _samples(t, np.ones_like(t)).assign(model_id="m2")
    with pytest.raises(InputError, match="several configurations"):
        energy_figures.plot_power_over_time(pd.concat([a, b]))
