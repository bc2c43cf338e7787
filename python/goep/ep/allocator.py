"""Allocator hooks, as ``nccl.ep`` declares them: ``AllocFn``, ``FreeFn`` and
``AllocConfig`` (``GroupConfig.alloc``).

NCCL EP allocates a group's device buffers through them. goep's buffers are
host memory that the engine maps itself (MPI shared memory inside a node, its
own buffers across nodes), so the hooks are accepted, checked and kept, but
never called: a program that passes them runs unchanged, goep allocating its
buffers itself.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from goep.ep.errors import NcclInvalid

__all__ = ["AllocConfig", "AllocFn", "FreeFn"]

AllocFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p)
"""The C type ``int (*)(void **ptr, size_t size, void *context)`` (NCCL's
returns a cudaError_t). Decorate a Python function with it, and pass its
address, ``ctypes.cast(fn, ctypes.c_void_p).value``, as ``alloc_fn``."""

FreeFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
"""The C type ``int (*)(void *ptr, void *context)``."""


@dataclass
class AllocConfig:
    """Allocator hooks (``ncclEpAllocConfig_t``): the addresses of an
    ``AllocFn`` and a ``FreeFn`` (0: the default) and a context pointer
    passed to them. goep never calls them (see the module's docstring)."""

    alloc_fn: int = 0
    free_fn: int = 0
    context: int = 0

    def check(self, where: str = "alloc") -> None:
        """Raise NcclInvalid naming a field that is not an address."""
        for name in ("alloc_fn", "free_fn", "context"):
            v = getattr(self, name)
            if isinstance(v, ctypes._CFuncPtr):
                raise NcclInvalid(f"{where}.{name} is a ctypes function; want its address: "
                                  "ctypes.cast(fn, ctypes.c_void_p).value")
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 64:
                raise NcclInvalid(f"{where}.{name} = {v!r}: want an address (an integer, 0 for none)")
