"""Zoo expansion: stable ids, every (model, input, batch, mode), consecutive shards."""

from __future__ import annotations

import copy

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
