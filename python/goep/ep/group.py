"""``Group`` and its ``GroupConfig``; the memory plan (``buffer_plan``)."""

from __future__ import annotations

import ctypes
import numbers
from dataclasses import dataclass, field

import numpy as np

from goep.ep import _lib
from goep.ep.allocator import AllocConfig
from goep.ep.enums import (Algorithm, Call, CombineQuantizationRecipe, DataType, DispatchQuantizationRecipe, Layout,
                           OverflowPolicy, ZeroCopyMode)
from goep.ep.errors import NcclInvalid
from goep.ep.handle import CallStructs, Handle, HandleConfig, LayoutInfo
from goep.ep.tensor import address_of, as_tensor

__all__ = ["Group", "GroupConfig", "MemInfo", "buffer_plan"]


@dataclass
class GroupConfig:
    """``goepEpGroupConfig_t``: the same on every rank (checked). The fields
    are nccl.ep's, in its order, then goep's own (``datatype``).

    Attributes:
        algorithm: LOW_LATENCY (default) or HIGH_THROUGHPUT.
        num_experts: a multiple of the number of ranks; rank r owns experts
            [r*L, (r+1)*L), L = num_experts / nranks.
        max_dispatch_tokens_per_rank: the most tokens one rank dispatches.
        max_recv_tokens_per_rank: HT, the most rows one rank receives (0: nranks
            * max_dispatch_tokens_per_rank); LL ignores it.
        max_token_bytes: bytes of one token row: hidden * element size.
        rdma_buffer_size, num_qp_per_rank, num_channels, max_num_sms: how
            NCCL EP sizes its GPU resources. Accepted, range-checked and kept;
            no effect on the CPU engine, which sizes its buffers from the
            fields above (:func:`buffer_plan`).
        alloc: allocator hooks (:class:`AllocConfig`). Accepted, checked and
            kept; never called: goep's buffers are host memory it maps itself.
        enable_mask: LL only: mask a rank that stalls past the timeout instead
            of failing (:meth:`Group.mask_query`, :meth:`Group.get_async_error`).
        timeout_ns: bound on every wait for a peer; 0 is 60 s.
        zero_copy: (:class:`ZeroCopyMode`) AUTO and OFF are accepted, ON is
            refused (goep has no windows; its own way without copies is
            ``DispatchOutputs(tokens=None)`` and :meth:`Handle.recv_tokens`).
        overflow_policy: (:class:`OverflowPolicy`) HT: DROP drops the rows
            beyond ``max_recv_tokens_per_rank`` (they add nothing to the
            combine), the same on every rank; AUTO and TRAP fail the dispatch
            on every rank.
        num_topk: experts per token, an upper bound on each handle's; 0 (as
            in nccl.ep): the group's first handle sets it. The group's buffers
            are allocated, collectively, by its first handle, with this top-k
            (or that handle's); a later handle with fewer is padded (LL only),
            one with more is refused.
        datatype: (goep) the tokens' element type, BFLOAT16 (numpy uint16
            bits, torch.bfloat16) or FLOAT32.
        backend: (goep) the ep backend that moves the rows, by its registered
            name and options ("cpu", "cpu-onesided"; ``ep-bench -device
            list`` lists them); "" is "cpu". The C interface takes those that declare
            refusals and call checks, and refuses the others by name.
        combine_quant: (goep) :class:`CombineQuantizationRecipe` of every
            combine: NONE, FP8 / FP8_UE8M0 (LL and HT: the expert outputs
            travel as e4m3 codes and scales) or NVFP4 (LL EXPERT_MAJOR: as
            FP4 codes with e4m3 block scales and a row scale;
            ``CombineInputs(scales=)`` is None or nccl.ep's global scales),
            where the backend declares it.
        dispatch_quant: (goep) :class:`DispatchQuantizationRecipe` of every
            dispatch: NONE, DS_FP8E3M4 (the rows cast to e4m3 with a float32
            scale per 128 elements, received as ``DispatchOutputs(tokens=codes,
            scales=scales)``), FWD (the caller's e4m3 codes and scales,
            ``DispatchInputs(tokens=codes, scales=scales)``) or FWD_NVFP4 (the
            caller's NVFP4 rows, ``FLOAT4X2`` codes and e4m3 scale bytes, per
            16 elements). goep lays out a group's buffers for one format, so
            it is the group's: a dispatch's ``quantization_recipe`` is NONE or
            this one (FWD also names FWD_NVFP4, as in nccl.ep).
        dispatch_round_scales: (goep) with DS_FP8E3M4, round each scale up
            to a power of two (NCCL EP's ``round_scales``).
    """

    algorithm: Algorithm = Algorithm.LOW_LATENCY
    num_experts: int = 0
    max_dispatch_tokens_per_rank: int = 0
    max_recv_tokens_per_rank: int = 0
    max_token_bytes: int = 0
    rdma_buffer_size: int = 0
    num_qp_per_rank: int = 0
    num_channels: int = 0
    max_num_sms: int = 0
    alloc: AllocConfig = field(default_factory=AllocConfig)
    enable_mask: bool = False
    timeout_ns: int = 0
    zero_copy: ZeroCopyMode = ZeroCopyMode.AUTO
    overflow_policy: OverflowPolicy = OverflowPolicy.AUTO
    num_topk: int = 0
    datatype: DataType = DataType.BFLOAT16
    backend: str = ""
    combine_quant: CombineQuantizationRecipe = CombineQuantizationRecipe.NONE
    dispatch_quant: DispatchQuantizationRecipe = DispatchQuantizationRecipe.NONE
    dispatch_round_scales: int = 0

    def check(self) -> None:
        """Raise NcclInvalid naming the first field out of its C type's range."""
        for name, bits in (("num_experts", 32), ("max_dispatch_tokens_per_rank", 32), ("max_recv_tokens_per_rank", 32),
                           ("max_token_bytes", 32), ("rdma_buffer_size", 64), ("num_qp_per_rank", 32),
                           ("num_channels", 32), ("max_num_sms", 32), ("num_topk", 32), ("timeout_ns", 64)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= int(v) < 1 << bits:
                raise NcclInvalid(f"GroupConfig.{name} = {v!r}: want an integer from 0 to 2**{bits}-1")
        for name, enum in (("algorithm", Algorithm), ("zero_copy", ZeroCopyMode), ("overflow_policy", OverflowPolicy),
                           ("datatype", DataType), ("combine_quant", CombineQuantizationRecipe),
                           ("dispatch_quant", DispatchQuantizationRecipe)):
            try:
                enum(getattr(self, name))
            except (TypeError, ValueError):
                raise NcclInvalid(f"GroupConfig.{name} = {getattr(self, name)!r}: want one of "
                                  f"{', '.join(m.name for m in enum)}") from None
        if not isinstance(self.alloc, AllocConfig):
            raise NcclInvalid(f"GroupConfig.alloc is a {type(self.alloc).__name__}; want an AllocConfig")
        self.alloc.check("GroupConfig.alloc")

    def _c(self):
        """The goepEpGroupConfig_t (NCCL EP's layout) of a checked config."""
        self.check()
        return _config_c(self)

    def _options(self):
        """The goepEpGroupOptions_t of goep's own settings: the token type and the backend."""
        dt = DataType(self.datatype)
        if dt not in (DataType.BFLOAT16, DataType.FLOAT32):
            raise NcclInvalid(f"config.datatype = {dt.name.lower()} ({int(dt)}): want BFLOAT16 or FLOAT32, the token "
                              "element types")
        if not isinstance(self.backend, str):
            raise NcclInvalid(f"GroupConfig.backend = {self.backend!r}: want a backend's name (a str), or \"\"")
        if self.dispatch_round_scales not in (0, 1, False, True):
            raise NcclInvalid(f"GroupConfig.dispatch_round_scales = {self.dispatch_round_scales!r}: want 0 or 1")
        return _lib.new(_lib.GroupOptions_c, token_datatype=int(dt), backend=self.backend.encode() or None,
                        combine_quant=int(self.combine_quant), dispatch_quant=int(self.dispatch_quant),
                        dispatch_round_scales=int(self.dispatch_round_scales))


def _config_c(cfg: GroupConfig):
    """The C struct of a checked GroupConfig, field for field (the token type
    goes in the options struct, _options)."""
    alloc = _lib.AllocConfig_c(alloc_fn=cfg.alloc.alloc_fn or None, free_fn=cfg.alloc.free_fn or None,
                               context=cfg.alloc.context or None)
    return _lib.new(_lib.GroupConfig_c, version=_lib.API_VERSION, algorithm=int(cfg.algorithm),
                    num_experts=int(cfg.num_experts), max_dispatch_tokens_per_rank=int(cfg.max_dispatch_tokens_per_rank),
                    max_recv_tokens_per_rank=int(cfg.max_recv_tokens_per_rank),
                    max_token_bytes=int(cfg.max_token_bytes), rdma_buffer_size=int(cfg.rdma_buffer_size),
                    num_qp_per_rank=int(cfg.num_qp_per_rank), num_channels=int(cfg.num_channels),
                    max_num_sms=int(cfg.max_num_sms), alloc=alloc, enable_mask=int(bool(cfg.enable_mask)),
                    timeout_ns=int(cfg.timeout_ns), zero_copy=int(cfg.zero_copy),
                    overflow_policy=int(cfg.overflow_policy), num_topk=int(cfg.num_topk))


@dataclass
class MemInfo:
    """The memory a group holds (``goepEpMemInfo_t``), in bytes."""

    shared_per_rank: int
    window_per_rank: int
    copies_per_rank: int
    per_node: int
    ranks_per_node: int


_create_handle = _lib.lib.goepEpCreateHandle


def buffer_plan(config: GroupConfig, nranks: int, nnodes: int = 1) -> MemInfo:
    """The memory a group of ``config`` would hold over ``nranks`` ranks on
    ``nnodes`` nodes, computed without allocating anything. Not collective."""
    info = _lib.new(_lib.MemInfo_c)
    _lib.call("goepEpBufferPlanWithOptions", ctypes.byref(config._c()), ctypes.byref(config._options()), int(nranks),
              int(nnodes), ctypes.byref(info))
    return MemInfo(info.shared_per_rank, info.window_per_rank, info.copies_per_rank, info.per_node, info.ranks_per_node)


def _comm_handle(comm) -> int:
    """The MPI_Comm of an mpi4py communicator (or an integer handle)."""
    if isinstance(comm, int):
        return comm
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise NcclInvalid("comm: pass an mpi4py communicator (mpi4py is not importable) or an MPI_Comm handle") from e
    if not isinstance(comm, MPI.Comm):
        raise NcclInvalid(f"comm is a {type(comm).__name__}; want a goep.core.Communicator or an mpi4py communicator "
                          "(e.g. MPI.COMM_WORLD)")
    return MPI._handleof(comm)


class Group:
    """A group of ranks that dispatch and combine together, over an mpi4py
    communicator. Create it with :meth:`create` (collective), release it
    with :meth:`destroy` (collective)."""

    def __init__(self, ptr: int, config: GroupConfig, nranks: int, rank: int) -> None:
        self._ptr = ptr
        self.config = config
        self.nranks = nranks
        self.rank = rank
        self._calls = CallStructs()
        self._recv_views = {}  # Handle.recv_tokens' arrays over the receive buffer

    @classmethod
    def create(cls, comm, config: GroupConfig) -> Group:
        """Create a group over the ranks of ``comm`` (a
        :class:`goep.core.Communicator`, as nccl.ep takes nccl.core's, or an
        mpi4py communicator; MPI is initialised by mpi4py, never by goep).
        Collective, with the same config on every rank. The group works on a
        duplicate of comm."""
        from mpi4py import MPI

        from goep.core import Communicator

        if isinstance(comm, Communicator):
            comm = comm.mpi
        if isinstance(comm, MPI.Comm):
            nranks, rank = comm.Get_size(), comm.Get_rank()
        else:
            nranks, rank = -1, -1
        ptr = ctypes.c_void_p()
        _lib.call("goepEpCreateGroupWithOptions", ctypes.byref(ptr), _comm_handle(comm), ctypes.byref(config._c()),
                  ctypes.byref(config._options()))
        return cls(ptr.value, config, nranks, rank)

    def _check_valid(self, operation: str) -> None:
        if not self._ptr:
            raise NcclInvalid(f"cannot {operation}: the group is destroyed", status=5)

    @property
    def ptr(self) -> int:
        """The goepEpGroup_t."""
        self._check_valid("read ptr")
        return self._ptr

    @property
    def num_local_experts(self) -> int:
        return self.config.num_experts // self.nranks

    def create_handle(self, layout: Layout, topk_idx, *, layout_info: LayoutInfo | None = None,
                      config: HandleConfig | None = None, stream=None) -> Handle:
        """A handle for one step's routing: ``topk_idx`` ``[num_tokens,
        num_topk]`` int32 or int64 expert ids (-1 = none), copied and checked.
        Local, but numbered: every rank creates its handles in the same order.
        A refused one (:class:`NcclInvalid`) makes the dispatch it stood for
        fail on every rank, this rank taking part in it at its next
        ``create_handle``, ``dispatch`` or ``destroy``. ``layout_info`` must be
        None (goep writes the counters at dispatch); ``stream`` is ignored."""
        if not self._ptr:
            self._check_valid("create_handle")
        keep = []
        try:
            t = address_of(topk_idx, "topk_idx", False, keep)
            if layout_info is not None:
                raise NcclInvalid("create_handle: layout_info must be None: goep writes the layout counters at dispatch "
                                  "(pass layout_info to Handle.dispatch)", status=5)
        except Exception as e:
            # The handle's number is taken and the dispatch it stood for fails on every rank, as when the
            # library refuses topk_idx itself.
            _lib.refuse(e, group=self._ptr, call=Call.CREATE_HANDLE)
        s = self._calls.s
        rc = _create_handle(s.handle_at, self._ptr, int(layout), t, None, s.handle_config(config), None)
        if rc:
            _lib.check(rc)
        return Handle(s.handle.value, self)

    def init_handle(self, layout: Layout, num_topk: int, config: HandleConfig | None = None,
                    handle_mem=None) -> Handle:
        """A handle of ``layout`` without routing: :meth:`Handle.update` gives it
        each step's (one handle for a loop of steps, instead of one per step).
        ``num_topk``: the group's ``num_topk``, or 0. ``handle_mem``: None (the
        library's memory), or a 1-D uint8 array of at least
        :meth:`handle_mem_size` bytes, 4-byte aligned, where the handle keeps
        its routing; the handle holds a reference to it. Local and not
        numbered."""
        self._check_valid("init_handle")
        mem = as_tensor(handle_mem, "handle_mem", True)
        ptr = ctypes.c_void_p()
        _lib.call("goepEpInitHandle", ctypes.byref(ptr), self._ptr, int(layout),
                  ctypes.pointer(config._c()) if config is not None else None, int(num_topk),
                  mem.ptr if mem is not None else None)
        h = Handle(ptr.value, self)
        h._mem = mem
        return h

    def handle_mem_size(self, layout: Layout, num_topk: int = 0, config: HandleConfig | None = None) -> int:
        """The host bytes a handle holds at most."""
        self._check_valid("handle_mem_size")
        n = ctypes.c_size_t()
        _lib.call("goepEpHandleMemSize", self._ptr, int(layout), ctypes.pointer(config._c()) if config else None,
                  ctypes.byref(n), int(num_topk))
        return n.value

    @property
    def buffer_bytes(self) -> int:
        """The bytes of buffers the group holds on this rank; NcclInvalid
        before its first handle, which allocates them."""
        self._check_valid("read buffer_bytes")
        n = ctypes.c_size_t()
        _lib.call("goepEpGroupBufferBytes", self._ptr, ctypes.byref(n))
        return n.value

    def mask_query(self) -> np.ndarray:
        """The mask: int32 ``[nranks]``, 1 = active, 0 = masked. Local."""
        self._check_valid("mask_query")
        out = np.zeros(self.nranks, dtype=np.intc)
        _lib.call("goepEpMaskQuery", self._ptr, out.ctypes.data_as(ctypes.POINTER(ctypes.c_int)))
        return out

    def mask_update(self, mask) -> None:
        """Make ``mask`` (``[nranks]``, 1 active, 0 masked) the mask; collective
        over the ranks it leaves active."""
        self._check_valid("mask_update")
        m = np.ascontiguousarray(mask, dtype=np.intc)
        if m.shape != (self.nranks,):
            raise NcclInvalid(f"mask has shape {m.shape}; want ({self.nranks},)")
        _lib.call("goepEpMaskUpdate", self._ptr, m.ctypes.data_as(ctypes.POINTER(ctypes.c_int)))

    def mask_clean(self) -> None:
        """Make every rank active again; collective over every rank, a masked
        one that came back included."""
        self._check_valid("mask_clean")
        _lib.call("goepEpMaskClean", self._ptr)

    def get_async_error(self) -> int:
        """1 once a call has masked a stalled rank, until :meth:`error_clear`."""
        self._check_valid("get_async_error")
        v = ctypes.c_int()
        _lib.call("goepEpGetAsyncError", self._ptr, ctypes.byref(v))
        return v.value

    def error_clear(self) -> None:
        self._check_valid("error_clear")
        _lib.call("goepEpErrorClear", self._ptr)

    def destroy(self) -> None:
        """Release the group (collective). Its handles become invalid."""
        if self._ptr:
            _lib.call("goepEpGroupDestroy", self._ptr)
            self._ptr = 0
            self._recv_views.clear()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"<Group {self._ptr:#x} rank {self.rank} of {self.nranks}>" if self._ptr else "<Group destroyed>"
