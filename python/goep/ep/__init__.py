"""goep.ep: expert-parallel dispatch and combine over MPI, shaped after NCCL
EP's ``nccl.ep`` so that a program written for it ports by changing its
imports and its device buffers to host ones (numpy arrays, PyTorch CPU
tensors, DLPack or array-interface objects: :class:`Tensor`)::

    from mpi4py import MPI
    import goep.ep as nccl_ep

    group = nccl_ep.Group.create(MPI.COMM_WORLD, nccl_ep.GroupConfig(
        algorithm=nccl_ep.Algorithm.LOW_LATENCY, num_experts=..., num_topk=...,
        max_dispatch_tokens_per_rank=..., max_token_bytes=hidden * 2))
    handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, topk_idx)
    handle.dispatch(nccl_ep.DispatchInputs(tokens=x, topk_weights=w),
                    nccl_ep.DispatchOutputs(tokens=recv),
                    layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
    handle.combine(nccl_ep.CombineInputs(tokens=expert_out),
                   nccl_ep.CombineOutputs(tokens=out, topk_weights=w))
    handle.destroy(); group.destroy()

It calls goep's C library (libgoep_ep.so) through ctypes; docs/capi.md
describes both.

A rank that dies ends the job: importing this package installs a
``sys.excepthook`` that, after printing the traceback of an exception nothing
caught, aborts the MPI job (``MPI.COMM_WORLD.Abort``) when it has more than
one rank. Without it the rank's exit would wait in ``MPI_Finalize`` for the
others, which wait for it in their calls until their timeout, and then in
``MPI_Finalize`` too. ``GOEP_EP_ABORT_ON_EXCEPTION=0`` leaves the hook out.
"""

import os as _os
import sys as _sys

from typing import NamedTuple as _NamedTuple

from goep.ep._lib import path as _lib_path
from goep.ep.allocator import AllocConfig, AllocFn, FreeFn
from goep.ep.enums import (
    Algorithm,
    Call,
    CombineQuantizationRecipe,
    DataType,
    DispatchQuantizationRecipe,
    ExpertIdKind,
    Feature,
    Layout,
    OverflowPolicy,
    PassDir,
    Result,
    ZeroCopyMode,
)
from goep.ep.errors import NCCLEpError, NCCLError, NcclInvalid, NcclMasked, NcclMismatch, NcclRemoteError, NcclTimeout
from goep.ep.group import Group, GroupConfig, MemInfo, buffer_plan
from goep.ep.handle import (
    CombineConfig,
    CombineInputs,
    CombineOutputs,
    DispatchConfig,
    DispatchInputs,
    DispatchOutputs,
    Handle,
    HandleConfig,
    LayoutInfo,
)
from goep.ep.tensor import Tensor

BFLOAT16 = DataType.BFLOAT16
FLOAT32 = DataType.FLOAT32
INT32 = DataType.INT32
INT64 = DataType.INT64

__all__ = [
    "Algorithm", "AllocConfig", "AllocFn", "BFLOAT16", "Call", "CombineConfig", "CombineInputs", "CombineOutputs",
    "CombineQuantizationRecipe", "DataType", "DispatchConfig", "DispatchInputs", "DispatchOutputs",
    "DispatchQuantizationRecipe", "ExpertIdKind", "FLOAT32", "Feature", "BackendInfo", "FreeFn", "Group", "GroupConfig", "Handle", "HandleConfig",
    "INT32", "INT64", "Layout", "LayoutInfo", "LibVersion", "MemInfo", "NCCLEpError", "NCCLError", "NcclInvalid",
    "NcclMasked", "NcclMismatch", "NcclRemoteError", "NcclTimeout", "OverflowPolicy", "PassDir", "Result", "Tensor",
    "ZeroCopyMode", "backend_supports", "backends", "buffer_plan", "get_lib_path", "get_lib_version",
]


class LibVersion(_NamedTuple):
    """A version, read as nccl.ep's ``packaging.version.Version`` reads:
    ``major``, ``minor``, ``micro``, ``release``, and ``str()`` "0.1.0"; it is
    also the tuple ``(major, minor, micro)``."""

    major: int
    minor: int
    micro: int

    @property
    def release(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.micro)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.micro}"


def get_lib_version() -> LibVersion:
    """The loaded library's version (its GOEP_EP_VERSION_CODE decoded)."""
    import ctypes

    from goep.ep import _lib

    v = ctypes.c_int()
    _lib.call("goepEpGetVersion", ctypes.byref(v))
    return LibVersion(v.value // 10000, v.value // 100 % 100, v.value % 100)


class BackendInfo(_NamedTuple):
    """goep extension: a backend a group can run on (``GroupConfig.backend``)
    and the names of the :class:`Feature` members it declares."""

    name: str
    features: tuple[str, ...]


def backend_supports(backend: str, feature: Feature) -> bool:
    """goep extension: whether the backend named ``backend`` (a name or an
    alias) declares ``feature`` (goepEpBackendSupports); an unknown backend
    or feature raises :class:`NcclInvalid` naming it."""
    import ctypes

    from goep.ep import _lib

    v = ctypes.c_int()
    _lib.call("goepEpBackendSupports", str(backend).encode(), int(feature), ctypes.byref(v))
    return bool(v.value)


def backends() -> list[BackendInfo]:
    """goep extension: every backend the library can run a group on, by name,
    with the features it declares, as the library reports them."""
    import ctypes

    from goep.ep import _lib

    n = ctypes.c_int()
    _lib.call("goepEpBackendCount", ctypes.byref(n))
    out = []
    for i in range(n.value):
        buf = ctypes.create_string_buffer(256)
        _lib.call("goepEpBackendName", i, buf, len(buf))
        name = buf.value.decode()
        out.append(BackendInfo(name, tuple(f.name for f in Feature if backend_supports(name, f))))
    return out


def get_lib_path():
    """The path of the loaded libgoep_ep.so."""
    return _lib_path


def _abort_on_uncaught(previous):
    """A sys.excepthook: previous (the traceback), then MPI_Abort of the whole job,
    where mpi4py has initialised MPI with more than one rank."""

    def hook(kind, value, tb):
        previous(kind, value, tb)
        mpi = _sys.modules.get("mpi4py.MPI")  # never imported here: that would initialise MPI
        try:
            if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() < 2:
                return
            _sys.stderr.write(f"goep.ep: rank {mpi.COMM_WORLD.Get_rank()}: uncaught {kind.__name__}: aborting the MPI "
                              "job, so that the other ranks do not wait for this one (GOEP_EP_ABORT_ON_EXCEPTION=0 "
                              "leaves this out)\n")
            _sys.stderr.flush()
        except Exception:  # MPI itself failed: nothing more to do here
            return
        mpi.COMM_WORLD.Abort(1)

    hook.goep_abort = True
    return hook


if _os.environ.get("GOEP_EP_ABORT_ON_EXCEPTION", "1") != "0" and not getattr(_sys.excepthook, "goep_abort", False):
    _sys.excepthook = _abort_on_uncaught(_sys.excepthook)
