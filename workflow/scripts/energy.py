"""Rule energy_<device>: Grzelka's energy analysis (Measuring Energy Consumption of Deep Learning Workloads) of one cuda device, regenerated from its sensor files.

Tables (all configurations): per run energy/time/EDP from the samples, mean ± sd per power limit, the
quadratic fits against the limit with R², counter vs integrated-sample energy of every energy window, and
the sampling-rate statistics. Figures: power over time per limit, cumulative energy mean ± sd, energy /
time / EDP vs limit with the quadratic fit, for the configuration with the highest mean power (the one a
power limit affects most), and the sampling-jitter histogram of all samples.
"""
from pathlib import Path
from typing import Any

import pandas as pd

from perfzoo import energy
from perfzoo.io import read_parquet, write_json, write_text
from perfzoo.plotting import empty_figure, save_figure
from perfzoo.report import energy as energy_figures
from perfzoo.report.registry import outputs

CONFIG_KEYS = ["model_id", "mode", "batch"]
COUNTER_COLUMNS = [
    "model_id", "mode", "batch", "repeat", "power_limit_w", "window_s", "window_iters",
    "window_energy_counter_j", "window_energy_samples_j", "energy_disagreement", "power_source",
    "sensor_errors", "energy_message",
]
#: the rule's outputs, named as in rules/energy.smk: the registry's energy entries (figures also as ``<name>_pdf``)
OUTPUTS = tuple(o.name.removeprefix("energy_") for o in outputs(rule="energy"))


def _csv(path: str | Path, frame: pd.DataFrame) -> None:
    write_text(path, frame.to_csv(index=False, float_format="%.6g"))


def _placeholder(out: dict[str, str], name: str, text: str) -> None:
    save_figure(empty_figure(text), out[name])


def _plot(plot: Any, frame: pd.DataFrame, out: dict[str, str], name: str, title: str) -> None:
    """The figure as PNG and, beside it, as PDF (the registry's vector file)."""
    save_figure(plot(frame, title=title), out[name])


def _labelled(frame: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    return frame.merge(labels, on="model_id", how="left") if len(frame) and "model_id" in frame else frame


def showcase(runs: pd.DataFrame) -> dict[str, Any] | None:
    """The configuration with the highest mean power over its runs (ties: sorted keys)."""
    ok = runs[runs["mean_power_w"].notna()] if len(runs) else runs
    if not len(ok):
        return None
    means = ok.groupby(CONFIG_KEYS, sort=True)["mean_power_w"].mean()
    return {k: getattr(v, "item", lambda v=v: v)() for k, v in zip(CONFIG_KEYS, means.idxmax(), strict=True)}


def _concat(paths: list[str], empty_columns: list[str]) -> pd.DataFrame:
    frames = [f for f in (read_parquet(p) for p in paths) if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=empty_columns)


def analyse(
    device: str, sensor_paths: list[str], trace_paths: list[str], manifest: pd.DataFrame, out: dict[str, str],
) -> dict[str, Any]:
    """Write every table and figure named in ``out`` (keys: :data:`OUTPUTS`); return what was shown."""
    samples = _concat(sensor_paths, ["t_ns", "power_w"])
    labels = manifest[["model_id", "label"]].drop_duplicates("model_id")
    traces = _concat(trace_paths, ["status"])
    ok = traces[traces["status"] == "ok"] if len(traces) else traces
    windows = (ok.drop_duplicates(["config_id", "repeat", "power_limit_w"]) if len(ok) else ok).reindex(
        columns=COUNTER_COLUMNS)
    _csv(out["counter_vs_samples"], _labelled(windows, labels))

    runs = (energy.run_energy(samples) if len(samples)
            else pd.DataFrame(columns=[*CONFIG_KEYS, "mean_power_w"]))
    summary = energy.summarize_vs_limit(runs) if len(runs) else pd.DataFrame()
    fits = energy.fits_vs_limit(summary) if len(summary) else pd.DataFrame()
    for name, frame in (("runs", runs), ("summary", summary), ("fits", fits)):
        _csv(out[name], _labelled(frame, labels))
    jitter = energy.sampling_jitter(samples) if len(samples) else {"n": 0}
    stats = {k: v for k, v in jitter.items() if k not in ("counts", "edges")}
    _csv(out["jitter"], pd.DataFrame([{"device": device, **stats}]))
    if jitter["n"]:
        _plot(energy_figures.plot_sampling_jitter, samples, out, "sampling_jitter", f"{device}: NVML sampling rate")
    else:
        _placeholder(out, "sampling_jitter", f"{device}: no sensor samples")

    shown = showcase(runs)
    figures = ("power_over_time", "cumulative_energy", "metrics_vs_limit")
    if shown is None:
        for name in figures:
            _placeholder(out, name, f"{device}: no sensor samples with power readings")
        return {"showcase": None}
    select = (samples[CONFIG_KEYS] == pd.Series(shown)).all(axis=1)
    one = samples[select]
    one_summary = summary[(summary[CONFIG_KEYS] == pd.Series(shown)).all(axis=1)]
    label = labels.set_index("model_id")["label"].get(shown["model_id"], shown["model_id"])
    title = f"{device}: {label}, {shown['mode']}, batch {shown['batch']}"
    _plot(energy_figures.plot_power_over_time, one, out, "power_over_time", title)
    _plot(energy_figures.plot_cumulative_energy, one, out, "cumulative_energy", title)
    _plot(energy_figures.plot_metrics_vs_limit, one_summary, out, "metrics_vs_limit", title)
    return {"showcase": {**shown, "label": label}}


def main() -> None:
    from perfzoo.provenance import provenance

    inputs = snakemake.input
    device = snakemake.params.device
    out = {name: str(getattr(snakemake.output, name)) for name in OUTPUTS}
    shown = analyse(device, list(inputs.sensors), list(inputs.traces), read_parquet(inputs.manifest), out)
    prov = provenance([inputs.manifest, *inputs.sensors, *inputs.traces], {"device": device})
    write_json(snakemake.output.provenance, {**prov, **shown})


if "snakemake" in globals():
    from perfzoo.workflow import run_step

    run_step(snakemake, main)  # noqa: F821 - injected by Snakemake
