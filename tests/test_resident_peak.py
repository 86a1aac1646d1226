"""The CPU's peak-memory label counts what the step allocates, not the library pages it maps: file-backed
pages, whose number depends on the page cache's state, are left out (perfzoo.profiling.core.ResidentPeak)."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from perfzoo.profiling.core import ResidentPeak

PAGE = mmap.PAGESIZE
MB = 2**20


def _touch(buffer, size: int) -> None:
    """Write one byte per page, so every page of ``buffer`` becomes resident."""
    for offset in range(0, size, PAGE):
        buffer[offset] = 1


def _read_every_page(mapped: mmap.mmap, size: int) -> int:
    return sum(mapped[offset] for offset in range(0, size, PAGE))


@pytest.fixture
def mapped_file(tmp_path: Path):
    """A 32 MB file, written (so its pages are in the page cache) and mapped read-only, not yet touched."""
    path = tmp_path / "library.bin"
    path.write_bytes(b"\x01" * (32 * MB))
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        yield mapped


def test_file_backed_pages_mapped_beside_an_allocation_are_not_in_the_label(mapped_file) -> None:
    resident = ResidentPeak.start()
    assert _read_every_page(mapped_file, 32 * MB) == 32 * MB // PAGE  # 32 MB of file pages now resident
    block = bytearray(64 * MB)
    _touch(block, 64 * MB)
    resident.close_phase()
    del block
    assert resident.total_mb == pytest.approx(96, abs=6)  # the whole resident set grew by both
    assert resident.label_mb == pytest.approx(64, abs=6)  # the label: the allocation only


def test_a_peak_in_one_phase_is_kept_when_a_later_phase_maps_files(mapped_file) -> None:
    resident = ResidentPeak.start()
    block = bytearray(64 * MB)
    _touch(block, 64 * MB)
    del block  # freed: the resident set is back near its baseline, the high-water mark is not
    resident.close_phase()
    _read_every_page(mapped_file, 32 * MB)
    resident.close_phase()
    assert resident.label_mb == pytest.approx(64, abs=6)
    assert resident.growth_mb()["file"] == pytest.approx(32, abs=2)
