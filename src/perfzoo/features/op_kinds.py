"""Names of the operator trace (:mod:`perfzoo.features.ops`) without torch: its kinds, the per-operator
table's columns and the model-level ``op_*`` feature columns, for the stages that read them (dataset,
fitting, regressors, prediction) and must not pay for importing torch."""

from __future__ import annotations

OP_KINDS = (
    "matmul", "attention", "conv", "conv_backward", "conv_grouped", "conv_grouped_backward", "recurrent", "norm",
    "pool", "softmax", "reduction", "elementwise", "embedding", "copy", "optimizer", "other", "view",
)  # fmt: skip
FREE_KIND = "view"
GROUPED_KINDS = {"conv": "conv_grouped", "conv_backward": "conv_grouped_backward"}
"""The kind of a convolution with ``groups > 1`` (depthwise and grouped), per kind of the plain one."""
COSTED_KINDS = tuple(k for k in OP_KINDS if k != FREE_KIND)
FLOP_KINDS = (
    "matmul", "attention", "conv", "conv_backward", "conv_grouped", "conv_grouped_backward", "recurrent", "other",
)  # fmt: skip
"""Kinds whose operators have FLOP formulas (FlopCounterMode counts matmuls, convolutions and attention)."""
OP_STATS = ("flops", "bytes", "count")
OP_FEATURE_KINDS = {f"op_{kind}_{stat}": (kind, stat) for kind in COSTED_KINDS for stat in OP_STATS
                    if stat != "flops" or kind in FLOP_KINDS}
"""Each model-level operator feature and its (kind, statistic)."""
OP_FEATURES = tuple(OP_FEATURE_KINDS)
OP_ERROR_COLUMN = "op_trace_error"
OP_COLUMNS = [
    "model_id", "mode", "batch", "op_idx", "op", "kind", "phase", "in_shapes", "out_shapes", "dtype",
    "flops", "bytes_read", "bytes_written", "bytes_cached", "intensity",
]  # fmt: skip
PHASES = ("forward", "backward", "optimizer")
OP_TIME_PREFIX = "optime_"
"""Prefix of the measured per-kind operator times (``optime_<kind>_ms``, :mod:`perfzoo.features.op_times`):
auxiliary labels, never features."""
