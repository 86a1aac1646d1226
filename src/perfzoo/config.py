"""Load and check the workflow configuration (JSON schema with defaults, then semantic checks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


from snakemake.utils import validate

from perfzoo.hardware.precision import check_supported
from perfzoo.hardware.specs import lookup_gpu
from perfzoo.io import InputError, read_yaml
from perfzoo.models.builders import BUILDER_NAMES, check_factory_reference, check_model_kwargs, check_model_name
from perfzoo.models.zoo import expanded_entries, model_entries

#: the members each blend fits (:mod:`perfzoo.regressors.blend`), named here for the rules too: a blend's fit job is
#: given the saved models of a member that runs as a regressor of its own, to reuse them (``rules/fit.smk``)
BLEND_MEMBERS = {"composed_blend": ("composed", "poly_lasso"), "memory_blend": ("memory_sim", "poly_lasso")}
PACKAGE_DATA = ("schemas/config.schema.yaml",)  # read by perfzoo.depends: rules rerun when it changes
SCHEMA = Path(__file__).parent / PACKAGE_DATA[0]


def load_config(path: str | Path) -> dict[str, Any]:
    """Read ``path``, validate it against the schema (filling defaults) and check model names."""
    config = read_yaml(path, "config file")
    validate_config(config, source=str(path))
    return config


def validate_config(config: dict[str, Any], source: str = "config") -> None:
    """Schema validation (defaults filled in place) followed by model-name checks."""
    try:
        validate(config, str(SCHEMA))
    except Exception as exc:  # WorkflowError carrying jsonschema's message and the key path
        raise InputError(f"{source}: {_schema_error_line(exc)}") from None
    check_sources(config, source)
    check_precisions(config, source)
    check_workflow_config(config)


def check_workflow_config(config: dict[str, Any]) -> None:
    """Every check that can fail before profiling starts: model names of the zoo and of ``predict:``,
    generated variants and model arguments, duplicate model entries, split fractions."""
    check_model_names(config)
    check_model_arguments(config)
    check_duplicate_models(config)
    check_predict_models(config)
    check_split_fractions(config)


def check_duplicate_models(config: dict[str, Any]) -> None:
    """A model listed twice in a family (same name, variant and arguments) is an error naming it."""
    for family, spec in config.get("zoo", {}).get("families", {}).items():
        seen: dict[str, int] = {}
        for i, entry in enumerate(model_entries(spec)):
            key = json.dumps(entry, sort_keys=True, default=str)
            if key in seen:
                raise InputError(
                    f"zoo.families.{family}.models[{i}]: duplicate of models[{seen[key]}] "
                    f"({entry['name']!r}{', variant ' + repr(entry['variant']) if entry['variant'] else ''}); "
                    "give it another variant name or remove it"
                )
            seen[key] = i


def check_predict_models(config: dict[str, Any]) -> None:
    """Each ``predict:`` entry names a model that exists (checked without building it)."""
    for name, entry in (config.get("predict") or {}).items():
        model, where = str(entry.get("model", "")), f"predict.{name}.model"
        prefix, _, rest = model.partition(":")
        if prefix in BUILDER_NAMES and prefix != "python":
            check_model_name(prefix, rest, where)
        elif model.rpartition(":")[0].endswith(".py"):
            check_factory_reference(model.removeprefix("python:"), where)


def check_split_fractions(config: dict[str, Any]) -> None:
    fractions = (config.get("splits") or {}).get("random_fractions")
    if fractions is not None and sum(fractions) > 1 + 1e-9:
        raise InputError(
            f"splits.random_fractions: {fractions} sum to {sum(fractions):g}, more than 1 "
            "(train, validation and test shares of the rows)"
        )


def check_sources(config: dict[str, Any], source: str = "config") -> None:
    """The config profiles local devices (devices and zoo.families both given), imports tables, or both."""
    devices = bool(config.get("devices"))
    families = bool(config.get("zoo", {}).get("families"))
    if devices != families:
        given, lacking = ("devices", "zoo.families") if devices else ("zoo.families", "devices")
        raise InputError(f"{source}: {given} is given but {lacking} is empty; profiling needs both "
                         "(or leave both out and import measurement tables under external:)")
    if not devices and not config.get("external"):
        raise InputError(f"{source}: nothing to do: give devices and zoo.families to profile, "
                         "or external: tables to import")


def check_precisions(config: dict[str, Any], source: str = "config") -> None:
    """A zoo precision that needs tensor cores a configured GPU lacks (bf16 on a V100) names the device."""
    wanted = {p for family in config.get("zoo", {}).get("families", {}).values()
              for p in family.get("precisions", ["fp32"])}
    for name, device in config.get("devices", {}).items():
        if device.get("kind") != "cuda":
            continue
        try:
            spec = lookup_gpu(device.get("spec") or device.get("gpu_name", ""))
        except InputError:
            continue  # a GPU the spec table does not know: its own profiling job reports what it is
        for precision in sorted(wanted):
            check_supported(spec, precision, f"{source}: devices.{name}")


def check_model_names(config: dict[str, Any]) -> None:
    """Every family's builder and model names exist (close names are suggested otherwise)."""
    for family, spec in config["zoo"]["families"].items():
        for i, entry in enumerate(model_entries(spec)):
            check_model_name(spec["builder"], entry["name"], f"zoo.families.{family}.models[{i}]")


def check_model_arguments(config: dict[str, Any]) -> None:
    """Each family's ``grid:`` / ``sample:`` expands, and every model takes the arguments it is given
    (where that can be told without building it)."""
    for family, spec in config["zoo"]["families"].items():
        for entry in expanded_entries(family, spec):
            label = f"{entry['name']}-{entry['variant']}" if entry["variant"] else entry["name"]
            check_model_kwargs(spec["builder"], entry["name"], entry["kwargs"], f"zoo.families.{family}[{label}]")


def _schema_error_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # snakemake's message: "Error validating config file.\n<jsonschema message>\n\nFailed validating ... in schema[...]\nOn instance['zoo']..."
    message = next((ln for ln in lines[1:] if not ln.startswith("Error validating")), lines[0] if lines else text)
    where = next((ln for ln in lines if ln.startswith("On instance")), "")
    return f"{message} [{where.removeprefix('On instance').rstrip(':')}]" if where else message
