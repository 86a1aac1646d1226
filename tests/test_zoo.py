"""Zoo expansion: stable ids, every (model, input, batch, mode), consecutive shards."""

from __future__ import annotations

import copy
import json

from perfzoo.models.zoo import expand_zoo, manifest_frame, shard_names


def test_expansion_covers_every_combination(config) -> None:
    configs = expand_zoo(config)
    assert len(configs) == 2 * 1 * 2 + 1 * 1 * 2  # mlp: 2 models x 1 batch x 2 modes; transformer: 2 modes
    assert {c.mode for c in configs} == {"inference", "training"}
    assert [c.shard for c in configs] == ["s0000"] * 4 + ["s0001"] * 2
    assert shard_names(len(configs), 4) == ["s0000", "s0001"]


def test_ids_are_stable_and_depend_on_the_spec(config) -> None:
    first = manifest_frame(expand_zoo(config))
    again = manifest_frame(expand_zoo(copy.deepcopy(config)))
    assert first["config_id"].tolist() == again["config_id"].tolist()
    config["zoo"]["families"]["mlp"]["models"][0]["kwargs"]["hidden"] = [32, 64]
    changed = manifest_frame(expand_zoo(config))
    assert changed["model_id"].iloc[0] != first["model_id"].iloc[0]
    assert changed["model_id"].iloc[2] == first["model_id"].iloc[2]  # the other model keeps its id


def test_model_id_is_shared_by_batches_and_modes(config) -> None:
    config["zoo"]["families"]["mlp"]["batch_sizes"] = [4, 8]
    m = manifest_frame(expand_zoo(config))
    small = m[m["label"] == "mlp_small@64"]
    assert small["model_id"].nunique() == 1
    assert small["config_id"].nunique() == 4


def test_ten_thousand_configs_expand_quickly() -> None:
    families = {f"f{i}": {"builder": "mlp", "models": [{"name": "mlp", "variant": f"v{j}", "kwargs": {"hidden": [j + 1]}}
                                                       for j in range(50)],
                          "batch_sizes": [1, 2, 4, 8, 16], "modes": ["inference", "training"]} for i in range(10)}
    configs = expand_zoo({"zoo": {"families": families}, "shards": {"size": 50}})
    assert len(configs) == 5000
    assert len({c.shard for c in configs}) == 100


# --------------------------------------------------------------------------- generated variants

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from conftest import ROOT  # noqa: E402
from perfzoo.config import load_config, validate_config  # noqa: E402
from perfzoo.io import InputError  # noqa: E402
from perfzoo.models.zoo import expanded_entries  # noqa: E402


def mlp_family(**extra) -> dict:
    return {"builder": "mlp", "models": [{"name": "mlp", "kwargs": {"in_features": 4}}], "input_shape": [4],
            "batch_sizes": [1], "modes": ["inference"], **extra}


def test_default_config_expands_to_the_manifest_its_measurements_are_keyed_by() -> None:
    # the fixture is the manifest of a complete default run (ids, labels, shards); generated variants
    # must leave configs without grid/sample exactly as they were
    expected = pd.read_csv(ROOT / "tests" / "fixtures" / "default-zoo-manifest.csv")
    manifest = manifest_frame(expand_zoo(load_config(ROOT / "config.yaml")))
    pd.testing.assert_frame_equal(manifest[expected.columns].reset_index(drop=True), expected)


def test_grid_is_the_cartesian_product_first_key_slowest() -> None:
    family = mlp_family(grid={"hidden": [[8], [16, 16]]})
    family["models"][0]["variant"] = "w"
    entries = expanded_entries("f", family)
    assert [e["variant"] for e in entries] == ["w-hidden8", "w-hidden16x16"]
    assert [e["kwargs"] for e in entries] == [{"in_features": 4, "hidden": [8]}, {"in_features": 4, "hidden": [16, 16]}]
    family = {"builder": "transformer", "models": ["encoder"], "grid": {"layers": [1, 2], "d_model": [32, 64, 96]}}
    variants = [e["variant"] for e in expanded_entries("f", family)]
    assert variants[:3] == ["layers1-d_model32", "layers1-d_model64", "layers1-d_model96"]
    assert len(variants) == 6


def sample_family(seed: int = 3, n: int = 6) -> dict:
    return {"builder": "transformer", "models": ["encoder"], "sequence_lengths": [8], "batch_sizes": [1],
            "sample": {"n": n, "seed": seed, "kwargs": {
                "layers": {"int": [1, 12]}, "d_model": {"int": [64, 512], "step": 64},
                "ff_mult": {"choice": [2, 4]}, "dropout": {"float": [0.0, 0.5], "digits": 2}}}}


def test_sample_draws_n_distinct_variants_within_their_ranges_reproducibly() -> None:
    entries = expanded_entries("f", sample_family())
    assert len({json.dumps(e["kwargs"], sort_keys=True) for e in entries}) == 6
    for kwargs in (e["kwargs"] for e in entries):
        assert 1 <= kwargs["layers"] <= 12 and isinstance(kwargs["layers"], int)
        assert kwargs["d_model"] in range(64, 513, 64)
        assert kwargs["ff_mult"] in (2, 4)
        assert 0.0 <= kwargs["dropout"] <= 0.5 and kwargs["dropout"] == round(kwargs["dropout"], 2)
    assert entries == expanded_entries("f", copy.deepcopy(sample_family()))
    assert entries != expanded_entries("f", sample_family(seed=4))
    assert entries[0]["variant"] == "-".join(f"{k}{v}" for k, v in entries[0]["kwargs"].items())


def test_grid_and_sample_together_give_every_grid_point_every_draw() -> None:
    family = sample_family(n=3)
    family["grid"] = {"heads": [1, 2]}
    entries = expanded_entries("f", family)
    assert len(entries) == 6
    draws = [{k: v for k, v in e["kwargs"].items() if k != "heads"} for e in entries]
    assert draws[:3] == draws[3:]
    assert [e["kwargs"]["heads"] for e in entries] == [1, 1, 1, 2, 2, 2]


IDS_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from perfzoo.models.zoo import expand_zoo
print(json.dumps([c.config_id for c in expand_zoo(json.loads(sys.argv[2]))]))
"""


def test_generated_ids_do_not_depend_on_the_interpreter() -> None:
    config = {"zoo": {"families": {"s": sample_family(), "g": mlp_family(grid={"hidden": [[8], [16]]})}}}
    ids = []
    for hash_seed in ("0", "1"):  # str hashes (and set orders) differ between these interpreters
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", IDS_SCRIPT, str(ROOT / "src"), json.dumps(config)],
                             capture_output=True, text=True, env=env, check=True).stdout
        ids.append(json.loads(out))
    assert ids[0] == ids[1] == [c.config_id for c in expand_zoo(config)]
    assert len(set(ids[0])) == 6 * 2 + 2  # 6 sampled models x 2 modes, 2 grid points x 1 mode


@pytest.mark.parametrize(("extra", "error"), [
    ({"sample": {"n": 2, "kwargs": {"hidden": {"uniform": [1, 2]}}}}, r"zoo\.families\.f\.sample\.kwargs\.hidden: unknown distribution 'uniform'"),
    ({"sample": {"n": 2, "kwargs": {"in_features": {"int": [5, 2]}}}}, r"f\.sample\.kwargs\.in_features\.int: empty range \[5, 2\]"),
    ({"sample": {"n": 2, "kwargs": {"hidden": {"choice": []}}}}, r"f\.sample\.kwargs\.hidden\.choice: expected a non-empty list"),
    ({"sample": {"n": 2, "kwargs": {"hidden": {"float": [1.0, 1.0]}}}}, r"f\.sample\.kwargs\.hidden\.float: empty range"),
    ({"sample": {"n": 2, "kwargs": {"hidden": {"int": [1, 9], "stepp": 2}}}}, r"f\.sample\.kwargs\.hidden\.stepp: not an option"),
    ({"sample": {"n": 3, "kwargs": {"hidden": {"choice": [[1], [2]]}}}}, r"f\.sample: only 2 distinct variants"),
    ({"grid": {"hidden": []}}, r"zoo\.families\.f\.grid\.hidden: expected a non-empty list|\['f'\]\['grid'\]\['hidden'\]"),
    ({"grid": {"hidden": [[8], [8]]}}, r"f\.grid\.hidden: value \[8\] is listed twice"),
    ({"grid": {"depth": [1, 2]}}, r"zoo\.families\.f\.grid\.depth: mlp model 'mlp' takes no argument 'depth'"),
    ({"sample": {"n": 1, "kwargs": {"depth": {"int": [1, 2]}}}}, r"f\.sample\.kwargs\.depth: mlp model 'mlp' takes no argument"),
    ({"grid": {"in_features": [2, 4]}}, r"f\.models\[0\]: 'in_features' is set both in the model's kwargs and by"),
    ({"grid": {"hidden": [[8]]}, "sample": {"n": 1, "kwargs": {"hidden": {"choice": [[2]]}}}}, r"f: 'hidden' is both in grid and in sample"),
])
def test_bad_grid_or_sample_is_a_one_line_error_naming_family_and_key(config, extra, error) -> None:
    config["zoo"]["families"]["f"] = mlp_family(**extra)
    with pytest.raises(InputError, match=error) as caught:
        validate_config(config)
    assert "\n" not in str(caught.value)
    with pytest.raises(InputError, match=error):
        expand_zoo(config)


def test_python_factory_arguments_are_read_from_its_source(config, tmp_path) -> None:
    factory = tmp_path / "nets.py"
    factory.write_text("def build(width=8, depth=2):\n    pass\n\n\ndef anything(**kwargs):\n    pass\n")
    family = {"builder": "python", "models": [f"{factory}:build"], "input_shape": [4],
              "grid": {"width": [8, 16]}, "sample": {"n": 2, "kwargs": {"depht": {"int": [1, 4]}}}}
    config["zoo"]["families"]["f"] = family
    with pytest.raises(InputError, match=r"zoo\.families\.f\.sample\.kwargs\.depht: python model .* takes no "
                                         r"argument 'depht' \(it takes width, depth\)"):
        validate_config(config)
    family["models"] = [f"{factory}:anything"]
    validate_config(config)
    assert len(expanded_entries("f", family)) == 4
