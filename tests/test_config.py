"""Config validation: schema errors name the key, unknown names get close suggestions."""

from __future__ import annotations

import pytest
import yaml

from perfzoo.config import load_config, validate_config
from perfzoo.io import InputError
from perfzoo.models.zoo import expand_zoo


def test_default_config_is_valid_and_big_enough() -> None:
    config = load_config("config.yaml")
    configs = expand_zoo(config)
    assert len({c.family for c in configs}) >= 6
    assert len(configs) >= 60
    assert config["profiling"]["ci_target"] == 0.02  # default filled in from the schema


def test_the_schemas_predict_precisions_are_those_predict_accepts(config) -> None:
    from perfzoo.config import SCHEMA
    from perfzoo.hardware.precision import PREDICTABLE

    schema = yaml.safe_load(SCHEMA.read_text())
    entry = schema["properties"]["predict"]["additionalProperties"]["properties"]["precision"]
    assert tuple(entry["enum"]) == PREDICTABLE
    config["predict"] = {"m": {"model": "torchvision:resnet18", "precision": "bf16"}}
    with pytest.raises(InputError, match="precision"):
        validate_config(config)


def test_schema_violation_names_the_key(config) -> None:
    config["shards"]["size"] = 0
    with pytest.raises(InputError, match=r"size"):
        validate_config(config)


def test_unknown_top_level_key_is_rejected(config) -> None:
    config["profilling"] = {}
    with pytest.raises(InputError, match="profilling"):
        validate_config(config)


@pytest.mark.parametrize(
    ("builder", "name", "hint"),
    [("torchvision", "resnet19", "resnet18"), ("timm", "vit_tiny_patch16_22", "vit_tiny_patch16_224"),
     ("mlp", "mlp_smal", "mlp_small")],
)
def test_unknown_model_name_suggests_close_names(config, builder, name, hint) -> None:
    config["zoo"]["families"]["extra"] = {"builder": builder, "models": [name]}
    with pytest.raises(InputError, match=rf"zoo\.families\.extra\.models\[0\].*{name}.*{hint}"):
        validate_config(config)


def test_unknown_builder_is_a_schema_error(config) -> None:
    config["zoo"]["families"]["extra"] = {"builder": "torchvison", "models": ["resnet18"]}
    with pytest.raises(InputError, match="torchvison"):
        validate_config(config)


def test_missing_factory_function_is_named(config, tmp_path) -> None:
    model_file = tmp_path / "m.py"
    model_file.write_text("def build():\n    pass\n")
    config["zoo"]["families"]["mine"] = {"builder": "python", "input_shape": [4],
                                         "models": [f"{model_file}:biuld"]}
    with pytest.raises(InputError, match=r"biuld.*did you mean: build"):
        validate_config(config)


def test_unreadable_yaml_names_the_file(tmp_path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("devices: [unclosed\n")
    with pytest.raises(InputError, match="c.yaml"):
        load_config(bad)
    bad.write_text(yaml.safe_dump({"zoo": {"families": {}}}))
    with pytest.raises(InputError, match="devices"):
        load_config(bad)
