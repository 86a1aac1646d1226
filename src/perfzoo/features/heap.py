"""A deterministic model of the resident footprint glibc's malloc (main arena, 64-bit) leaves for a stream of
allocations and frees: :func:`perfzoo.features.memory.simulate_peak_memory` runs the simulated step's tensor
storages through it (``sim_heap_peak_bytes``, the peak term of ``memory_sim``).

A CPU process's peak-memory label is its resident set, and PyTorch's CPU tensors come from glibc's
``posix_memalign``: a block freed inside the heap stays resident, and where the next one goes depends on the order
and the sizes of the allocations before it. Replaying the simulated stream through glibc itself in a fresh process
moved by 4 % between two processes (bench/RESULTS.md, "allocation streams replayed through glibc"); this model has
no inherited heap and gives one number per stream (bench/RESULTS.md, "A deterministic model of glibc's heap").

What it keeps of glibc 2.3x (``malloc/malloc.c``): a request becomes a chunk of ``request + 8`` bytes rounded up to
16 (32 at least); it is served by the smallest free chunk that holds it (the lowest address among equals; split,
the rest stays free), else from the top chunk, else, at or above the mmap threshold, by a mapping of its own, else
by growing the heap by the request and ``M_TOP_PAD`` (128 KiB). A freed chunk merges with its free neighbours and
the top; a freed mapping raises the threshold to its size (up to 32 MiB) and the trim threshold to twice that; a
free of 64 KiB or more gives back the top beyond the pad once it exceeds the trim threshold. With ``tcache``, freed
chunks of up to 1,040 bytes (seven per size) are kept aside, not merged, as glibc's per-thread cache keeps them.
Resident: the heap's highest written byte below the break (freed chunks inside the heap stay resident) plus the
live mappings. Left out: fast bins, the unsorted bin's order, alignment padding, other arenas, and every allocation
the stream does not hold (Python's objects, kernels' temporaries).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

PAGE = 4096
MIN_CHUNK = 32
MMAP_THRESHOLD = 128 * 1024
MMAP_THRESHOLD_MAX = 32 * 2**20
TOP_PAD = 128 * 1024
CONSOLIDATION = 64 * 1024
TCACHE_MAX = 1040
TCACHE_COUNT = 7


def chunk_size(request: int) -> int:
    return max(MIN_CHUNK, (request + 8 + 15) & ~15)


def pages(size: int) -> int:
    return (size + PAGE - 1) // PAGE * PAGE


class Heap:
    """The footprint of one process's main arena; :attr:`peak` is the largest resident size seen."""

    def __init__(self, mmap_threshold: int = MMAP_THRESHOLD, tcache: bool = True) -> None:
        self.mmap_threshold = mmap_threshold
        self.trim_threshold = MMAP_THRESHOLD
        self.tcache = tcache
        self.brk = self.top = 0  # the heap's end, and where its top chunk starts
        self.by_size: list[tuple[int, int]] = []  # (size, start) of every free chunk, ordered
        self.free_size: dict[int, int] = {}
        self.free_ending: dict[int, int] = {}  # end -> start
        self.cached: dict[int, list[int]] = {}  # tcache: chunk size -> starts
        self.used: dict[object, tuple[int, int, bool]] = {}  # key -> (start, size, mapped)
        self.written = self.mapped = self.peak = 0

    def _unlink(self, start: int) -> int:
        size = self.free_size.pop(start)
        del self.free_ending[start + size]
        self.by_size.pop(bisect.bisect_left(self.by_size, (size, start)))
        return size

    def _link(self, start: int, size: int) -> None:
        self.free_size[start], self.free_ending[start + size] = size, start
        bisect.insort(self.by_size, (size, start))

    def _best_fit(self, size: int) -> int | None:
        """The start of the smallest free chunk of ``size`` bytes or more (the lowest among equals), or None."""
        i = bisect.bisect_left(self.by_size, (size, -1))
        return self.by_size[i][1] if i < len(self.by_size) else None

    def malloc(self, key: object, request: int) -> None:
        if request <= 0:
            return
        size = chunk_size(request)
        if self.tcache and size <= TCACHE_MAX and self.cached.get(size):
            self.used[key] = (self.cached[size].pop(), size, False)
            return
        mapped = False
        if (start := self._best_fit(size)) is not None:
            whole = self._unlink(start)
            if whole - size >= MIN_CHUNK:
                self._link(start + size, whole - size)
            else:
                size = whole
        elif self.brk - self.top >= size + MIN_CHUNK:
            start, self.top = self.top, self.top + size
        elif size >= self.mmap_threshold:
            start, size, mapped = -1, pages(size), True
            self.mapped += size
        else:
            self.brk += pages(size + TOP_PAD + MIN_CHUNK - (self.brk - self.top))
            start, self.top = self.top, self.top + size
        if not mapped:
            self.written = max(self.written, start + size)
        self.used[key] = (start, size, mapped)
        self.peak = max(self.peak, self.written + self.mapped)

    def free(self, key: object) -> None:
        if key not in self.used:
            return
        start, size, mapped = self.used.pop(key)
        if mapped:
            self.mapped -= size
            if self.mmap_threshold < size <= MMAP_THRESHOLD_MAX:
                self.mmap_threshold, self.trim_threshold = size, 2 * size
            return
        if self.tcache and size <= TCACHE_MAX and len(self.cached.setdefault(size, [])) < TCACHE_COUNT:
            self.cached[size].append(start)
            return
        freed = size
        if (before := self.free_ending.get(start)) is not None:
            size += self._unlink(before)
            start = before
        if start + size in self.free_size:
            size += self._unlink(start + size)
        if start + size == self.top:
            self.top = start
        else:
            self._link(start, size)
        if max(freed, size) >= CONSOLIDATION and self.brk - self.top >= self.trim_threshold:
            extra = (self.brk - self.top - TOP_PAD - MIN_CHUNK - 1) // PAGE * PAGE
            if extra > 0:
                self.brk -= extra
                self.written = min(self.written, self.brk)


def footprint_peak(events: Iterable[tuple], mmap_threshold: int = MMAP_THRESHOLD, tcache: bool = True) -> int:
    """Peak resident bytes of ``events`` (``("a", key, bytes)`` and ``("f", key)``, in order) in a fresh arena
    whose mmap threshold starts at ``mmap_threshold``."""
    heap = Heap(mmap_threshold, tcache)
    for event in events:
        if event[0] == "a":
            heap.malloc(event[1], event[2])
        else:
            heap.free(event[1])
    return heap.peak
