"""glibc's malloc state of the calling process, read without changing it (``bench/allocator_replay.py``).

Only the standard library, so that a fresh interpreter can ask before any large import touches its heap."""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD_MAX = 32 * 2**20
"""glibc's ceiling on the dynamic mmap threshold on 64-bit systems: :data:`perfzoo.features.heap.MMAP_THRESHOLD_MAX`,
written again because importing perfzoo already raises the threshold (to about 170 KiB); tests/test_heap.py checks
that the two agree."""


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def libc() -> ctypes.CDLL:
    """glibc with ``mallinfo2`` and ``malloc`` typed."""
    lib = ctypes.CDLL("libc.so.6")
    lib.mallinfo2.restype = MallInfo2
    lib.malloc.restype, lib.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    lib.free.argtypes = [ctypes.c_void_p]
    return lib


def mmap_threshold(lib: ctypes.CDLL) -> int:
    """The smallest request glibc serves by a mapping of its own in this process (within 16 bytes), by
    bisection; each probe runs in a fork, so none of them raises the threshold it measures."""

    def mapped(size: int) -> bool:
        pid = os.fork()
        if pid == 0:
            before = lib.mallinfo2().hblks
            lib.malloc(size)
            os._exit(1 if lib.mallinfo2().hblks > before else 0)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 1

    low, high = 1, MMAP_THRESHOLD_MAX + 1
    while high - low > 16:
        middle = (low + high) // 2
        low, high = (low, middle) if mapped(middle) else (middle, high)
    return high
