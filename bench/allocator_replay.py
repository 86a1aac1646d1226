"""How much of the CPU peak-memory label is the C allocator's fragmentation: allocation streams replayed through it.

    python bench/allocator_replay.py meta RESULTS OUT.csv              # every config: the meta stream, replayed
    python bench/allocator_replay.py real RESULTS KEY [KEY ...]         # the real CPU stream of some configs
    python bench/allocator_replay.py heap RESULTS KEY                   # glibc's heap after a measurement
    python bench/allocator_replay.py offline RESULTS OUT.csv            # memory_sim with the replayed peak
    python bench/allocator_replay.py model RESULTS OUT.csv              # every config: the meta stream, modelled
    python bench/allocator_replay.py blend RESULTS OUT.csv              # memory_sim, memory_blend on the model
    python bench/allocator_replay.py inherited RESULTS OUT.csv          # the model from the worker's inherited heap

A KEY is ``<model_id>_<mode>_<batch>`` of ``RESULTS/zoo/manifest.parquet``.

The label (:class:`perfzoo.profiling.core.ResidentPeak`) is a process's peak anonymous resident memory; the
simulation (:mod:`perfzoo.features.memory`) counts live tensor bytes. Between them is the C allocator: PyTorch's
CPU tensors come from glibc's ``posix_memalign``, and a freed block inside the heap stays resident.

* ``meta``: the simulation's own stream (each storage it registers, weights and input first, then the two replayed
  steps, and each release) is recorded per config and replayed in a fresh process (torch imported, one thread):
  ``torch.empty(n, dtype=uint8)`` per allocation, every byte written (pages resident), dropped at its release,
  measured by ``ResidentPeak`` as the label is. CSV: ``row_id``, ``replay_mib`` (every config of the dataset).
* ``real``: the same replay of the real CPU stream, every allocation and free of PyTorch's CPU allocator while
  the model is built and three steps run (``torch.profiler`` with ``profile_memory``), beside the stream's own
  live peak and the meta replay (if ``meta`` wrote ``/tmp/allocator_replay_meta.csv``).
* ``heap``: a measurement as the profile rule makes it (``measure_on_cpu``, torchvision and timm imported first
  as in the worker), then glibc's ``mallinfo2``: heap size, bytes in use, free bytes kept in the heap.
* ``model``: the meta stream of every config through a deterministic model of glibc's footprint instead of the
  allocator itself (``sim_heap_peak_bytes`` of the simulation, :mod:`perfzoo.features.heap`: no process, so no
  inherited heap state). CSV as ``meta`` (``replay_mib``: the model's peak), for ``offline``; printed: the label
  over the live peak and over the model's peak, per family and mode.
* ``blend``: ``memory_sim`` and ``memory_blend`` as the fit and evaluate rules score them (``fit_split`` through
  ``bench/composed_shrinkage.py``'s ``scores``) on the run's dataset with ``sim_heap_peak_bytes`` from ``OUT.csv``
  (a run made before the feature existed); MAPE % and 90 % coverage per split.
* ``inherited``: glibc's state in a worker forked from the profile rule's worker server (torch, torchvision and
  timm imported there): its mmap threshold, which the server's imports raised, found by bisection in forks of the
  worker (each probe in its own fork, so none changes the state it measures), and the heap's free bytes; then
  ``model`` and ``blend`` twice, side by side: the heap model started at glibc's default threshold (as
  ``sim_heap_peak_bytes``) and at the worker's (its trim threshold twice it, as glibc sets them together).
  Writes ``OUT.csv`` (default start) and ``OUT.inherited.csv``.
* ``offline``: ``memory_sim`` refitted on every split of ``RESULTS/splits/`` with its peak term on the live peak
  (``sim_peak_bytes``, as before 2026-11-30) and on the replayed peak of ``OUT.csv`` (and once with the difference
  also added to the activation term).
"""

from __future__ import annotations

import gc
import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import glibc_probe  # noqa: E402
import pandas as pd  # noqa: E402
from worker_servers import run_settings  # noqa: E402

MIB = 2.0**20
SPLITS = ("leave_one_family_out", "batch_extrapolation", "random", "family_monte_carlo", "stratified_kfold")
SHORT_WINDOW = {"max_iters": 6, "max_time_s": 0.5}
"""``heap`` measures memory only: the run's settings with a shorter timed window."""
META_CSV = Path(tempfile.gettempdir()) / "allocator_replay_meta.csv"


def manifest_row(results: Path, key: str) -> dict:
    model_id, mode, batch = key.rsplit("_", 2)
    manifest = pd.read_parquet(results / "zoo" / "manifest.parquet")
    hit = manifest[(manifest["model_id"] == model_id) & (manifest["mode"] == mode)
                   & (manifest["batch"] == int(batch))]
    if hit.empty:
        raise SystemExit(f"{key}: no such config in {results / 'zoo' / 'manifest.parquet'}")
    return hit.iloc[0].to_dict()


def meta_stream(row: dict, settings: dict) -> list[tuple]:
    """('a', key, bytes) and ('f', key) of the simulation of ``row``, in order."""
    import perfzoo.features.memory as memory
    from perfzoo.features.meta import manifest_builder, simulated_memory

    events: list[tuple] = []
    add, free = memory._LiveBytes.add, memory._LiveBytes._free

    def recording_add(self, tensor, category):  # noqa: ANN001, ANN202
        key = tensor.untyped_storage()._cdata
        if key not in self.live:
            events.append(("a", key, tensor.untyped_storage().nbytes()))
        return add(self, tensor, category)

    def recording_free(self, key):  # noqa: ANN001, ANN202
        events.append(("f", key))
        return free(self, key)

    memory._LiveBytes.add, memory._LiveBytes._free = recording_add, recording_free
    try:
        build, dtype = manifest_builder(row, settings["num_classes"])
        simulated_memory(build, tuple(json.loads(row["input_shape"])), int(row["batch"]), row["mode"], dtype,
                         settings["optimizer"], row["model_id"])
        gc.collect()
    finally:
        memory._LiveBytes.add, memory._LiveBytes._free = add, free
    return events


def real_stream(row: dict, settings: dict) -> list[tuple]:
    """('a', key, bytes) and ('f', key) of PyTorch's CPU allocator while ``row``'s model is built and 3 steps run."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from perfzoo.features.meta import manifest_builder
    from perfzoo.profiling.core import make_step, synthetic_batch

    torch.set_num_threads(int(settings["threads"]))
    build, _ = manifest_builder(row, settings["num_classes"])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = build()
        x, y = synthetic_batch(row, settings["num_classes"], "cpu")
        step = make_step(model, x, y, row["mode"], settings["optimizer"])
        for _ in range(3):
            step()
    found, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if type(node.extra_fields).__name__ == "_ExtraFields_Allocation":
            found.append((node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size))
    events, current, serial = [], {}, 0
    for _, pointer, size in sorted(found):
        if size > 0:
            current[pointer] = serial
            events.append(("a", serial, size))
            serial += 1
        elif pointer in current:
            events.append(("f", current.pop(pointer)))
    return events


def live_peak_mib(events: list[tuple]) -> float:
    sizes, live, peak = {}, 0, 0
    for event in events:
        if event[0] == "a":
            sizes[event[1]] = event[2]
            live += event[2]
            peak = max(peak, live)
        else:
            live -= sizes.pop(event[1])
    return peak / MIB


def replayed_peak_mib(events: list[tuple]) -> float:
    """The label-like peak of ``events`` replayed through PyTorch's CPU allocator in a fresh process."""
    with tempfile.NamedTemporaryFile(suffix=".pkl") as f:
        pickle.dump(events, f)
        f.flush()
        out = subprocess.run([sys.executable, __file__, "_replay", f.name], capture_output=True, text=True,
                             check=True)
    return float(out.stdout.split()[-1])


def _replay(path: str) -> None:
    import torch

    from perfzoo.profiling.core import ResidentPeak

    torch.set_num_threads(1)
    events = pickle.loads(Path(path).read_bytes())
    gc.collect()
    peak, live = ResidentPeak.start(), {}
    for event in events:
        if event[0] == "a":
            block = torch.empty(event[2], dtype=torch.uint8)
            block.fill_(1)
            live[event[1]] = block
        else:
            live.pop(event[1], None)
    peak.close_phase()
    print(f"{peak.label_mb:.3f}")


def meta(results: Path, out: Path) -> None:
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    settings, rows = run_settings(results), []
    for key in sorted({f"{m}_{o}_{b}" for m, o, b in zip(data["model_id"], data["mode"], data["batch"], strict=True)}):
        events = meta_stream(manifest_row(results, key), settings)
        rows.append({"key": key, "replay_mib": replayed_peak_mib(events), "meta_live_mib": live_peak_mib(events)})
        print(rows[-1], flush=True)
    keys = pd.DataFrame(rows)
    data["key"] = data["model_id"] + "_" + data["mode"] + "_" + data["batch"].astype(str)
    table = data[["row_id", "key", "peak_mem_mb"]].merge(keys, on="key")
    table.to_csv(out, index=False)
    table.to_csv(META_CSV, index=False)


def model(results: Path, out: Path) -> None:
    from perfzoo.features.meta import manifest_builder, simulated_memory

    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    data["key"] = data["model_id"] + "_" + data["mode"] + "_" + data["batch"].astype(str)
    settings, rows = run_settings(results), []
    for key in sorted(set(data["key"])):
        row = manifest_row(results, key)
        build, dtype = manifest_builder(row, settings["num_classes"])
        sim = simulated_memory(build, tuple(json.loads(row["input_shape"])), int(row["batch"]), row["mode"], dtype,
                               settings["optimizer"], row["model_id"])
        rows.append({"key": key, "meta_live_mib": sim.peak_bytes / MIB, "replay_mib": sim.heap_peak_bytes / MIB})
    table = data[["row_id", "key", "family", "mode", "peak_mem_mb"]].merge(pd.DataFrame(rows), on="key")
    table.to_csv(out, index=False)
    ratios = pd.DataFrame({"label / live peak": table["peak_mem_mb"] / table["meta_live_mib"],
                           "label / heap model's peak": table["peak_mem_mb"] / table["replay_mib"]})
    print(ratios.groupby([table["family"], table["mode"]]).median().round(3).to_markdown())
    print(ratios.describe().round(3).to_markdown())


def blend(results: Path, modelled: Path) -> None:
    from composed_shrinkage import scores

    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    peak = pd.read_csv(modelled).drop_duplicates("row_id").set_index("row_id")["replay_mib"]
    data = data.assign(sim_heap_peak_bytes=data["row_id"].map(peak) * MIB)
    for regressor in ("memory_sim", "memory_blend"):
        table = scores(results, {}, SPLITS, data, regressor, "peak_mem_mb")
        print(f"{regressor}: " + ", ".join(f"{s} {table.loc[s, 'mape']:.2f} [{100 * table.loc[s, 'coverage90']:.0f}]"
                                          for s in SPLITS), flush=True)


def real(results: Path, keys: list[str]) -> None:
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    data["key"] = data["model_id"] + "_" + data["mode"] + "_" + data["batch"].astype(str)
    label = data.drop_duplicates("key").set_index("key")["peak_mem_mb"]
    meta_replay = pd.read_csv(META_CSV).drop_duplicates("key").set_index("key") if META_CSV.exists() else None
    print("| config | label (run) MiB | real stream: live peak | real stream: replayed | meta stream: live peak | "
          "meta stream: replayed |")
    print("|---|---|---|---|---|---|")
    settings = run_settings(results)
    for key in keys:
        row = manifest_row(results, key)
        events = real_stream(row, settings)
        m = meta_replay.loc[key] if meta_replay is not None and key in meta_replay.index else None
        print(f"| {row['name']} {key} | {label[key]:.1f} | {live_peak_mib(events):.1f} | "
              f"{replayed_peak_mib(events):.1f} | {m['meta_live_mib'] if m is not None else float('nan'):.1f} | "
              f"{m['replay_mib'] if m is not None else float('nan'):.1f} |", flush=True)


def heap(results: Path, key: str) -> None:
    import timm  # noqa: F401 - imported before the measurement, as the worker's forkserver does
    import torchvision  # noqa: F401

    from perfzoo.profiling.core import rss_components_mb
    from perfzoo.profiling.measure import measure_on_cpu

    libc = glibc_probe.libc()

    def show(when: str) -> None:
        m = libc.mallinfo2()
        print(f"{when}: heap {m.arena / MIB:.1f} MiB (in use {m.uordblks / MIB:.1f}, free {m.fordblks / MIB:.1f}), "
              f"mmapped blocks {m.hblkhd / MIB:.1f} MiB; RssAnon {rss_components_mb()['anon']:.1f} MiB")

    gc.collect()
    show("before")
    measurement = measure_on_cpu(manifest_row(results, key), {**run_settings(results), **SHORT_WINDOW})
    gc.collect()
    show("after (model, batch and optimizer freed)")
    print(f"{key}: label {measurement.peak_mem_mb:.1f} MiB")


def _worker_heap_state(queue) -> None:  # noqa: ANN001 - a multiprocessing queue
    gc.collect()  # as the measurement does before its baseline
    libc = glibc_probe.libc()
    queue.put((glibc_probe.mmap_threshold(libc), libc.mallinfo2().fordblks))


def inherited(results: Path, out: Path) -> None:
    import perfzoo.features.memory as memory
    from perfzoo.features.heap import Heap
    from perfzoo.profiling.core import worker_context

    context = worker_context()
    queue = context.Queue()
    worker = context.Process(target=_worker_heap_state, args=(queue,))
    worker.start()
    threshold, free_bytes = queue.get()
    worker.join()
    print(f"a worker of the worker server: mmap threshold {threshold / 1024:.1f} KiB, {free_bytes / MIB:.2f} MiB free "
          f"in its heap", flush=True)

    class InheritedHeap(Heap):
        def __init__(self) -> None:
            super().__init__(threshold)
            self.trim_threshold = 2 * threshold

    for start, path in (("default threshold", out), ("the worker's threshold", out.with_suffix(".inherited.csv"))):
        print(f"## heap model from {start}", flush=True)
        memory.Heap = InheritedHeap if path != out else Heap
        try:
            model(results, path)
        finally:
            memory.Heap = Heap
        blend(results, path)


def offline(results: Path, replayed: Path) -> None:
    from perfzoo.regressors import MemorySimRegressor
    from perfzoo.stats import mape

    data = pd.read_parquet(results / "dataset" / "dataset.parquet").set_index("row_id")
    replay = pd.read_csv(replayed).set_index("row_id")["replay_mib"]
    live = data.assign(sim_heap_peak_bytes=data["sim_peak_bytes"])  # memory_sim's peak term before 2026-11-30
    with_replay = data.assign(sim_heap_peak_bytes=replay.reindex(data.index) * MIB)
    extra = (with_replay["sim_heap_peak_bytes"] - data["sim_peak_bytes"]).clip(lower=0)
    variants = {"live peak": live, "replayed peak": with_replay,
                "replayed peak, its excess also as activation":
                    with_replay.assign(sim_activation_bytes=data["sim_activation_bytes"] + extra)}
    table, families = {}, {}
    for split in SPLITS:
        folds = pd.read_parquet(results / "splits" / f"{split}.parquet")
        held = {name: [] for name in variants}
        for _, g in folds.groupby("fold"):
            train = [r for r in g.loc[g["set"] == "train", "row_id"] if r in data.index]
            test = [r for r in g.loc[g["set"] == "test", "row_id"] if r in data.index]
            if not test:
                continue
            for name, frame in variants.items():
                model = MemorySimRegressor().fit(frame.loc[train], frame.loc[train, "peak_mem_mb"])
                held[name].append(pd.DataFrame({"y": frame.loc[test, "peak_mem_mb"].to_numpy(),
                                                "p": model.predict(frame.loc[test]),
                                                "family": frame.loc[test, "family"].to_numpy()}))
        table[split] = {name: mape(pd.concat(h)["y"], pd.concat(h)["p"]) for name, h in held.items()}
        if split == "leave_one_family_out":
            families = {name: pd.concat(h).groupby("family").apply(lambda q: mape(q["y"], q["p"]))
                        for name, h in held.items()}
    print(pd.DataFrame(table).round(2).to_markdown())
    print(pd.DataFrame(families).T.round(1).to_markdown())
    for name, frame in variants.items():
        coef = MemorySimRegressor().fit(frame, frame["peak_mem_mb"]).coefficients("cpu")
        print(f"{name}: fitted on every row: {coef.round(3).to_dict()}")


if __name__ == "__main__":
    command, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if command == "_replay":
        _replay(args[0])
    elif command == "meta" and len(args) == 2:
        meta(Path(args[0]), Path(args[1]))
    elif command == "real" and len(args) >= 2:
        real(Path(args[0]), args[1:])
    elif command == "heap" and len(args) == 2:
        heap(Path(args[0]), args[1])
    elif command == "blend" and len(args) == 2:
        blend(Path(args[0]), Path(args[1]))
    elif command == "model" and len(args) == 2:
        model(Path(args[0]), Path(args[1]))
    elif command == "inherited" and len(args) == 2:
        inherited(Path(args[0]), Path(args[1]))
    elif command == "offline" and len(args) == 2:
        offline(Path(args[0]), Path(args[1]))
    else:
        raise SystemExit(__doc__)
