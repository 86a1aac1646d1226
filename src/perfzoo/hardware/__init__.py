"""What a device is: its description (host facts, spec-table row, MIG profiles, cost fields, ``hw_*``
features, measured calibration columns), the GPU spec-sheet table, MIG profile tables and their latency/memory
math, and the numeric precisions with the peak each one runs at. Nothing here measures (see perfzoo.profiling)."""

from perfzoo.hardware.device import (
    CALIBRATION_COLUMNS,
    CALL_COST_COLUMNS,
    CALL_COST_KINDS,
    DEFAULT_CARBON_INTENSITY_G_PER_KWH,
    DEPTHWISE_TEMPORARY_FACTOR,
    NO_ENERGY_SENSOR,
    MeasurementSetting,
    cost_fields,
    cpu_model_name,
    hardware_calibration,
    hardware_features,
    mig_profile_rows,
    spec_row,
    total_memory_gb,
)
from perfzoo.hardware.mig import (
    MIG_PROFILES,
    MigProfile,
    mig_profiles,
    mig_report_table,
    profile_table,
    recommend_mig,
    resolve_mig_gpu,
    scaled_latency_ms,
)
from perfzoo.hardware.precision import (
    BUILD_DTYPES,
    PRECISIONS,
    Peak,
    check_supported,
    normalise_precision,
    peak_for,
)
from perfzoo.hardware.specs import NUMERIC_COLUMNS, SPEC_COLUMNS, close_names, load_gpu_specs, lookup_gpu

__all__ = [
    "BUILD_DTYPES", "CALIBRATION_COLUMNS", "CALL_COST_COLUMNS", "CALL_COST_KINDS",
    "DEFAULT_CARBON_INTENSITY_G_PER_KWH", "DEPTHWISE_TEMPORARY_FACTOR",
    "MIG_PROFILES", "NO_ENERGY_SENSOR",
    "NUMERIC_COLUMNS", "PRECISIONS", "SPEC_COLUMNS", "MeasurementSetting", "MigProfile", "Peak",
    "check_supported", "close_names", "cost_fields", "cpu_model_name", "hardware_calibration",
    "hardware_features", "load_gpu_specs",
    "lookup_gpu", "mig_profile_rows", "mig_profiles", "mig_report_table", "normalise_precision", "peak_for",
    "profile_table", "recommend_mig", "resolve_mig_gpu", "scaled_latency_ms", "spec_row", "total_memory_gb",
]
