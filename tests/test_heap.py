"""The model of glibc's footprint (perfzoo.features.heap): a freed mapping raises the mmap threshold, a hole left
inside the heap stays resident, the top beyond the pad is given back, small chunks kept in the thread cache do not
merge with their neighbours, and a free chunk is reused by best fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from perfzoo.features.heap import MMAP_THRESHOLD, MMAP_THRESHOLD_MAX, TOP_PAD, Heap, chunk_size, footprint_peak

KIB, MIB = 1024, 2**20
BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_a_freed_mapping_raises_the_threshold_so_the_same_size_then_comes_from_the_heap():
    heap = Heap()
    heap.malloc("a", MIB)
    assert heap.mapped >= MIB and heap.written == 0
    heap.free("a")
    assert heap.mapped == 0 and heap.mmap_threshold > MIB
    heap.malloc("b", MIB)
    assert heap.mapped == 0 and heap.written >= MIB


def test_a_hole_inside_the_heap_stays_resident_and_a_larger_block_goes_above_it():
    events = [("a", "t", 100 * KIB), ("a", "u", 100 * KIB), ("f", "t"), ("a", "v", 120 * KIB)]
    live_peak = 220 * KIB
    assert footprint_peak(events, mmap_threshold=MIB) >= 320 * KIB > live_peak  # t's hole is too small for v
    refill = events[:3] + [("a", "v", 90 * KIB)]
    assert footprint_peak(refill, mmap_threshold=MIB) < 210 * KIB  # v fits in t's hole


def test_the_top_beyond_the_pad_is_given_back_once_above_the_trim_threshold():
    heap = Heap(mmap_threshold=64 * MIB)
    heap.malloc("small", 1 * KIB)
    heap.malloc("big", 8 * MIB)
    assert heap.written >= 8 * MIB
    heap.free("big")
    assert heap.written <= heap.top + TOP_PAD + 4 * KIB and heap.peak >= 8 * MIB


def test_chunks_in_the_thread_cache_keep_their_neighbours_apart():
    events = [("a", "x", 64 * KIB), ("a", "tiny", 500), ("a", "y", 64 * KIB), ("a", "guard", 64 * KIB),
              ("f", "x"), ("f", "tiny"), ("f", "y"), ("a", "z", 120 * KIB)]
    cached = footprint_peak(events, mmap_threshold=MIB)
    merged = footprint_peak(events, mmap_threshold=MIB, tcache=False)
    assert merged < cached  # without the cache x, tiny and y merge into one hole that takes z


def test_a_request_takes_the_smallest_free_chunk_that_holds_it():
    heap = Heap(mmap_threshold=MIB)
    for key, size in (("a", 300 * KIB), ("s1", 1 * KIB), ("b", 100 * KIB), ("s2", 1 * KIB), ("c", 200 * KIB),
                      ("s3", 1 * KIB)):
        heap.malloc(key, size)
    for key in ("a", "b", "c"):
        heap.free(key)
    heap.malloc("d", 150 * KIB)
    assert heap.used["d"][0] == heap.used["s2"][0] + heap.used["s2"][1]  # c's hole, not a's or b's


def test_the_threshold_a_freed_mapping_sets_is_glibcs_own():
    """In a fresh interpreter (only the standard library imported): glibc's threshold before and after a 3 MiB
    block is mapped and freed, probed without changing it (bench/glibc_probe.py), against the model's."""
    script = (f"import sys, json; sys.path.insert(0, {str(BENCH)!r}); import glibc_probe as g; lib = g.libc(); "
              "before = g.mmap_threshold(lib); lib.free(lib.malloc(3 * 2**20)); "
              "print(json.dumps([before, g.mmap_threshold(lib)]))")
    before, after = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                              check=True).stdout)
    assert abs(chunk_size(before) - MMAP_THRESHOLD) <= 16  # glibc's default: the model's start
    heap = Heap()
    heap.malloc("block", 3 * MIB)
    heap.free("block")
    assert abs(chunk_size(after) - heap.mmap_threshold) <= 16 and heap.mmap_threshold > 3 * MIB
    sys.path.insert(0, str(BENCH))
    try:
        import glibc_probe  # the probe's own copy of the ceiling (it cannot import perfzoo first)
    finally:
        sys.path.remove(str(BENCH))
    assert glibc_probe.MMAP_THRESHOLD_MAX == MMAP_THRESHOLD_MAX
