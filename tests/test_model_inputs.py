"""User model files (and the local modules they import) are rule inputs and provenance links."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from perfzoo.auditing import CHANGED, OK, audit
from perfzoo.models.files import user_module_files
from perfzoo.provenance import config_link, provenance

from conftest import snakemake

MODEL = '''
import torch.nn as nn
from layers import width
import blocks.head


def build(num_classes=10):
    return nn.Sequential(nn.Linear(4, width()), nn.ReLU(), blocks.head.head(width(), num_classes))
'''


def write_models(folder: Path, width: int = 8) -> None:
    (folder / "models").mkdir(exist_ok=True)
    (folder / "models" / "net.py").write_text(MODEL)
    (folder / "models" / "layers.py").write_text(f"import os\n\ndef width():\n    return {width}\n")
    (folder / "models" / "blocks").mkdir(exist_ok=True)
    (folder / "models" / "blocks" / "__init__.py").write_text("")
    (folder / "models" / "blocks" / "head.py").write_text(
        "import torch.nn as nn\n\ndef head(w, n):\n    return nn.Linear(w, n)\n")


def test_local_imports_are_found_transitively(tmp_path, monkeypatch) -> None:
    write_models(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert user_module_files(["models/net.py"]) == [
        "models/blocks/__init__.py", "models/blocks/head.py", "models/layers.py", "models/net.py"]


def test_config_subset_link_is_audited(tmp_path, monkeypatch) -> None:
    """A changed config section turns the link CHANGED; an unrelated edit leaves it OK."""
    import pandas as pd

    from perfzoo.provenance import write_table
    from perfzoo.config import load_config

    monkeypatch.chdir(tmp_path)
    cfg = {"devices": {"cpu": {"kind": "cpu", "threads": 1}},
           "zoo": {"num_classes": 10, "families": {"m": {"builder": "mlp", "input_shape": [4],
                                                         "models": ["mlp_small"]}}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    loaded = load_config(tmp_path / "config.yaml")
    out = tmp_path / "results" / "t.parquet"
    write_table(out, pd.DataFrame({"a": [1]}), provenance([], links=config_link(loaded, ["zoo.num_classes"])))
    assert audit(out).ok
    cfg["devices"]["cpu"]["threads"] = 2  # not read by this output
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert audit(out).ok
    cfg["zoo"]["num_classes"] = 5
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert [link.status for link in audit(out).links] == [CHANGED]


@pytest.mark.e2e
def test_editing_an_imported_model_module_reruns_and_breaks_the_audit(tmp_path) -> None:
    write_models(tmp_path)
    config = {
        "devices": {"cpu": {"kind": "cpu", "threads": 1}},
        "zoo": {"num_classes": 10, "families": {"user": {
            "builder": "python", "input_shape": [4], "batch_sizes": [2], "modes": ["inference"],
            "models": ["models/net.py:build"]}}},
        "shards": {"size": 4},
        "profiling": {"warmup_iters": 1, "min_iters": 3, "max_iters": 4, "max_time_s": 0.1, "repeat_every": 2},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    targets = ["results/features/models.parquet", "results/traces/cpu/s0000.parquet"]
    snakemake(tmp_path, *targets, cores=1)
    assert "Nothing to be done" in snakemake(tmp_path, "-n", *targets, cores=1).stdout
    features = tmp_path / "results/features/models.parquet"
    before = {link.key: link.status for link in audit(features).links}
    assert before["models/layers.py"] == OK
    assert before["config.yaml#zoo.num_classes,profiling.optimizer"] == OK
    # a prediction record carries this flattened chain, so its audit re-hashes the model files too
    from perfzoo.lineage import provenance_chain

    chain = provenance_chain({"features": features}, tmp_path)
    assert {"models/net.py", "models/layers.py", "models/blocks/head.py"} <= set(chain)

    write_models(tmp_path, width=64)  # the factory file itself is unchanged; a module it imports is not
    dry = snakemake(tmp_path, "-n", *targets, cores=1).stdout
    assert "rule features:" in dry and "rule trace_cpu:" in dry
    after = {link.key: link.status for link in audit(features).links}
    assert after["models/layers.py"] == CHANGED and after["models/net.py"] == OK
    traces = {link.key: link.status for link in audit(tmp_path / targets[1]).links}
    assert traces["models/layers.py"] == CHANGED
    meta = json.loads((tmp_path / "results/traces/cpu/s0000.meta.json").read_text())
    assert "config.yaml#devices.cpu,profiling,zoo.num_classes" in meta["provenance"]["inputs"]
