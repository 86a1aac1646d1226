"""bench/resident_parts.py: the reference step's resident-set growth by mapping adds up to its parts, and the label
is the anonymous part, not the library pages."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import resident_parts  # noqa: E402


def test_growth_by_mapping_adds_up_to_the_parts_and_the_label_leaves_out_the_files() -> None:
    result = resident_parts.measure_once(resident_parts)
    files = sum(mb for name, mb in result["mappings"].items() if name.startswith("/"))
    anonymous = sum(mb for name, mb in result["mappings"].items() if not name.startswith("/"))
    assert abs(files - result["parts"]["file"]) < 1.0, result["parts"]
    assert abs(anonymous - result["parts"]["anon"]) < 6.0, result["parts"]  # reading smaps allocates a few MB
    largest_file = max((name for name in result["mappings"] if name.startswith("/")), key=result["mappings"].get)
    assert largest_file.endswith("libtorch_cpu.so"), largest_file
    assert abs(result["label"] - result["parts"]["anon"]) < 2.0 < result["parts"]["file"], result
    assert result["total"] >= result["label"] + result["parts"]["file"] - 2.0, result
