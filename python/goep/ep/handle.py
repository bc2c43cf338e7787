"""``Handle`` (one step's routing) and the bundles its calls take, named as
``nccl.ep``'s: HandleConfig, DispatchConfig, CombineConfig, LayoutInfo,
DispatchInputs, DispatchOutputs, CombineInputs, CombineOutputs.

Tensors are host memory, described in place: numpy arrays, PyTorch CPU
tensors, DLPack or array-interface objects, or :class:`Tensor`; calls are
synchronous, so the ``stream`` arguments ``nccl.ep`` takes are accepted and
ignored.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from goep.ep import _lib
from goep.ep.enums import Call, CombineQuantizationRecipe, DataType, DispatchQuantizationRecipe, ExpertIdKind, PassDir
from goep.ep.errors import NcclInvalid
from goep.ep.tensor import Tensor, address_of, as_tensor

__all__ = [
    "CombineConfig",
    "CombineInputs",
    "CombineOutputs",
    "DispatchConfig",
    "DispatchInputs",
    "DispatchOutputs",
    "Handle",
    "HandleConfig",
    "LayoutInfo",
]

TensorLike = Any  # a Tensor, anything Tensor describes (a numpy array, a torch tensor, ...), or None


@dataclass
class HandleConfig:
    """``goepEpHandleConfig_t``: ``dispatch_output_per_expert_alignment`` pads each
    zone of the HT EXPERT_MAJOR layout to a multiple of this many rows (a power
    of two; 0 or 1: none); 0 or 1 in other layouts. The group's first handle
    sets it for the group."""

    dispatch_output_per_expert_alignment: int = 0

    def _c(self):
        return _lib.new(_lib.HandleConfig_c, dispatch_output_per_expert_alignment=self.dispatch_output_per_expert_alignment)


@dataclass
class DispatchConfig:
    """``goepEpDispatchConfig_t``. ``send_only``: only send; :meth:`Handle.complete`
    receives and writes the outputs (keep them alive until then)."""

    send_only: int = 0
    round_scales: int = 0
    pass_direction: PassDir = PassDir.FWD
    quantization_recipe: DispatchQuantizationRecipe = DispatchQuantizationRecipe.NONE

    def _c(self):
        return _lib.new(_lib.DispatchConfig_c, send_only=int(self.send_only), round_scales=int(self.round_scales),
                        pass_direction=int(self.pass_direction), quantization_recipe=int(self.quantization_recipe))


@dataclass
class CombineConfig:
    """``goepEpCombineConfig_t``."""

    send_only: int = 0
    pass_direction: PassDir = PassDir.FWD
    quantization_recipe: CombineQuantizationRecipe = CombineQuantizationRecipe.NONE

    def _c(self):
        return _lib.new(_lib.CombineConfig_c, send_only=int(self.send_only), pass_direction=int(self.pass_direction),
                        quantization_recipe=int(self.quantization_recipe))


@dataclass
class LayoutInfo:
    """``goepEpLayoutInfo_t``: counters a dispatch writes. ``expert_counters``
    ``[local_experts]`` int32/int64 (required in LL EXPERT_MAJOR; HT
    EXPERT_MAJOR: padded); ``src_rank_counters`` ``[nranks]`` (LL RANK_MAJOR);
    ``expert_offsets`` ``[local_experts]`` (HT EXPERT_MAJOR: where each zone
    starts); ``recv_total_counter`` ``[1]``: the rows received."""

    expert_counters: TensorLike = None
    src_rank_counters: TensorLike = None
    expert_offsets: TensorLike = None
    recv_total_counter: TensorLike = None
    recv_topk_idx_kind: ExpertIdKind = ExpertIdKind.AUTO


@dataclass
class DispatchInputs:
    """``tokens`` ``[num_tokens, hidden]`` (required), ``topk_weights``
    ``[num_tokens, num_topk]`` float32. A group with ``dispatch_quant=FWD``
    takes ``tokens`` as e4m3 codes (a uint8 array with ``dtype=FLOAT8E4M3``)
    and ``scales`` ``[num_tokens, ceil(hidden / 128)]`` float32; one with
    ``dispatch_quant=FWD_NVFP4`` takes ``tokens`` as NVFP4 codes ``[num_tokens,
    hidden / 2]`` (a uint8 array with ``dtype=FLOAT4X2``) and ``scales``
    ``[num_tokens, hidden / 16]`` uint8 (or ``dtype=FLOAT8E4M3``), e4m3 scale
    bytes; otherwise ``scales`` is None."""

    tokens: TensorLike = None
    topk_weights: TensorLike = None
    scales: TensorLike = None


@dataclass
class DispatchOutputs:
    """``tokens``: LL EXPERT_MAJOR ``[local_experts, nranks*max_tokens, hidden]``,
    LL RANK_MAJOR ``[nranks, max_tokens, hidden]``, HT ``[slots, hidden]``;
    None leaves the rows in the group's buffer (:meth:`Handle.recv_tokens`).
    ``topk_weights`` and ``topk_idx``: HT FLAT ``[slots, num_topk]``, LL
    RANK_MAJOR ``[nranks, max_tokens, num_topk]``, HT EXPERT_MAJOR weights
    ``[slots]``. An FP8 dispatch (``GroupConfig.dispatch_quant``) writes
    ``tokens`` as e4m3 codes (``dtype=FLOAT8E4M3``) and ``scales`` float32,
    the layout's leading dimensions then ``ceil(hidden / 128)``; an NVFP4 one
    (FWD_NVFP4) ``tokens`` as ``FLOAT4X2`` codes, the leading dimensions then
    ``hidden / 2``, and ``scales`` in the inputs' scale type, then
    ``hidden / 16``."""

    tokens: TensorLike = None
    topk_weights: TensorLike = None
    scales: TensorLike = None
    topk_idx: TensorLike = None


@dataclass
class CombineInputs:
    """``tokens``: the expert outputs, shaped as the dispatch's output tokens;
    HT ``topk_weights`` ``[slots, num_topk]``: values summed back per slot.
    ``scales``, in a group with ``combine_quant=NVFP4``: None (goep computes
    each row's scale), or nccl.ep's global scales ``[local_experts, nranks *
    max_tokens, 1]`` float32, ``2688 / amax`` of each valid row (0 where amax
    is 0), checked row by row (within a float32 step) and refused, naming the
    row, where one differs; None in other groups."""

    tokens: TensorLike = None
    topk_weights: TensorLike = None
    scales: TensorLike = None


@dataclass
class CombineOutputs:
    """``tokens`` ``[num_tokens, hidden]``; ``topk_weights`` ``[num_tokens, num_topk]``
    float32: LL, the weights applied; HT, the sums of the inputs' values."""

    tokens: TensorLike = None
    topk_weights: TensorLike = None


class _CallStructs:
    """The C structs a dispatch and a combine pass, made once per group and
    thread and filled at each call (their addresses fixed), so that a step's
    calls make no ctypes objects. Each thread has its own (``CallStructs``),
    so that one thread's call never reads what another's wrote."""

    def __init__(self) -> None:
        self.din, self.dout, self.info = (_lib.new(_lib.DispatchInputs_c), _lib.new(_lib.DispatchOutputs_c),
                                          _lib.new(_lib.LayoutInfo_c))
        self.cin, self.cout = _lib.new(_lib.CombineInputs_c), _lib.new(_lib.CombineOutputs_c)
        self.dcfg, self.ccfg = _lib.new(_lib.DispatchConfig_c), _lib.new(_lib.CombineConfig_c)
        self.hcfg = _lib.new(_lib.HandleConfig_c)
        self.handle = ctypes.c_void_p()
        a = ctypes.addressof
        self.din_at, self.dout_at, self.info_at = a(self.din), a(self.dout), a(self.info)
        self.cin_at, self.cout_at, self.dcfg_at, self.ccfg_at = a(self.cin), a(self.cout), a(self.dcfg), a(self.ccfg)
        self.hcfg_at, self.handle_at = a(self.hcfg), a(self.handle)
        self.recv_sizes = (ctypes.c_size_t * 8)()
        self.recv = _lib.new(_lib.Tensor_c, _lib.TENSOR_MAGIC, sizes=self.recv_sizes)
        self.recv_at = a(self.recv)

    def dispatch_config(self, c: DispatchConfig | None) -> int:
        if c is None:
            return 0
        d = self.dcfg
        d.send_only, d.round_scales = int(c.send_only), int(c.round_scales)
        d.pass_direction, d.quant_recipe = int(c.pass_direction), int(c.quantization_recipe)
        return self.dcfg_at

    def combine_config(self, c: CombineConfig | None) -> int:
        if c is None:
            return 0
        d = self.ccfg
        d.send_only, d.pass_direction, d.quant_recipe = int(c.send_only), int(c.pass_direction), int(c.quantization_recipe)
        return self.ccfg_at

    def handle_config(self, c: HandleConfig | None) -> int:
        if c is None:
            return 0
        self.hcfg.dispatch_output_per_expert_alignment = int(c.dispatch_output_per_expert_alignment)
        return self.hcfg_at


class CallStructs(threading.local):
    """A group's call structs, one set per thread (``.s``)."""

    def __init__(self) -> None:
        self.s = _CallStructs()


_dispatch, _combine = _lib.lib.goepEpDispatch, _lib.lib.goepEpCombine
_update, _destroy = _lib.lib.goepEpUpdateHandle, _lib.lib.goepEpHandleDestroy
_recv_tokens = _lib.lib.goepEpHandleRecvTokens
_RECV_DTYPES = {int(DataType.BFLOAT16): np.uint16, int(DataType.FLOAT32): np.float32}


class Handle:
    """One step's routing: created by :meth:`Group.create_handle`, released by
    :meth:`destroy`. A second dispatch of the same handle reuses its routing
    (a cached dispatch)."""

    # A handle is made every step: slots make it one object, quicker to make and to read.
    __slots__ = ("_ptr", "_dead", "_group", "_pending", "_mem", "_no_routing", "__weakref__")

    def __init__(self, ptr: int, group) -> None:
        self._ptr = ptr
        self._dead = 0  # the goepEpHandle_t once destroyed: its calls are refused on every rank
        self._group = group  # keeps the group object alive while the handle is
        self._pending = None  # the tensors a send-only call still uses
        self._mem = None  # the handle_mem tensor (Group.init_handle): the library keeps the routing in it
        self._no_routing = None  # why the handle has no routing, where this layer refused its last update

    def _check_valid(self, operation: str) -> None:
        if not self._ptr:
            raise NcclInvalid(f"cannot {operation}: the handle is destroyed", status=5)

    def _refuse(self, err: Exception, call: Call) -> None:
        """Take part in the collective call as a refusal because of err, so that
        the other ranks' same call fails at once naming this rank (and the
        ranks' calls stay matched); raise err."""
        _lib.refuse(err, handle=self._ptr or self._dead or None, call=call)

    @property
    def ptr(self) -> int:
        """The goepEpHandle_t."""
        self._check_valid("read ptr")
        return self._ptr

    def update(self, topk_idx, *, layout_info: LayoutInfo | None = None, stream=None) -> None:
        """Give the handle the next step's routing: ``topk_idx`` ``[num_tokens,
        num_topk]`` int32 or int64 expert ids (-1 = none), copied and checked,
        as :meth:`Group.create_handle` does for a new handle. Local, but
        numbered as a ``create_handle``: every rank updates in the same order.
        A refused update (:class:`NcclInvalid`) leaves the handle without
        routing: the dispatch it stood for, and every later one until an update
        succeeds, fails on every rank, naming this rank. An LL handle must have
        combined its dispatch first.
        ``layout_info`` must be None (goep writes the counters at dispatch);
        ``stream`` is ignored."""
        self._check_valid("update")
        keep = []
        try:
            t = address_of(topk_idx, "topk_idx", False, keep)
            if layout_info is not None:
                raise NcclInvalid("update: layout_info must be None: goep writes the layout counters at dispatch "
                                  "(pass layout_info to Handle.dispatch)", status=5)
        except Exception as e:
            # The step's number is taken and its dispatch fails on every rank, as when the library refuses
            # topk_idx itself; the library keeps the old routing, so this layer refuses the handle's
            # dispatches until an update succeeds.
            self._no_routing = f"its last update was refused: {e}"
            _lib.refuse(e, group=self._group._ptr, call=Call.CREATE_HANDLE)
        self._no_routing = "its last update was refused by the library"
        _lib.check(_update(self._ptr, t, None, None))
        self._no_routing = None

    def dispatch(self, inputs: DispatchInputs, outputs: DispatchOutputs, *, layout_info: LayoutInfo | None = None,
                 config: DispatchConfig | None = None, stream=None) -> None:
        """Send each token to the ranks owning its experts and write what this
        rank receives into ``outputs`` (and the counters into ``layout_info``).
        Collective. ``stream`` is ignored (host memory, synchronous calls)."""
        keep = []  # descriptors not cached: alive until the call returns
        s = self._group._calls.s
        try:
            if not self._ptr:
                self._check_valid("dispatch")
            if self._no_routing is not None:
                raise NcclInvalid(f"dispatch: the handle has no routing: {self._no_routing}; update it first",
                                  status=5)
            # Each tensor given is described (address_of); the absent ones (None) are 0 without a call,
            # since most of a step's are absent.
            din, dout = s.din, s.dout
            t = inputs.tokens
            din.tokens = 0 if t is None else address_of(t, "inputs.tokens", False, keep)
            t = inputs.topk_weights
            din.topk_weights = 0 if t is None else address_of(t, "inputs.topk_weights", False, keep)
            t = inputs.scales
            din.scales = 0 if t is None else address_of(t, "inputs.scales", False, keep)
            t = outputs.tokens
            dout.tokens = 0 if t is None else address_of(t, "outputs.tokens", True, keep)
            t = outputs.topk_weights
            dout.topk_weights = 0 if t is None else address_of(t, "outputs.topk_weights", True, keep)
            t = outputs.scales
            dout.scales = 0 if t is None else address_of(t, "outputs.scales", True, keep)
            t = outputs.topk_idx
            dout.topk_idx = 0 if t is None else address_of(t, "outputs.topk_idx", True, keep)
            info = 0
            if layout_info is not None:
                li, c = layout_info, s.info
                t = li.expert_counters
                c.expert_counters = 0 if t is None else address_of(t, "layout_info.expert_counters", True, keep)
                t = li.src_rank_counters
                c.src_rank_counters = 0 if t is None else address_of(t, "layout_info.src_rank_counters", True, keep)
                t = li.expert_offsets
                c.expert_offsets = 0 if t is None else address_of(t, "layout_info.expert_offsets", True, keep)
                t = li.recv_total_counter
                c.recv_total_counter = 0 if t is None else address_of(t, "layout_info.recv_total_counter", True,
                                                                      keep)
                c.recv_topk_idx_kind = int(li.recv_topk_idx_kind)
                info = s.info_at
            cfg = s.dispatch_config(config)
        except Exception as e:
            self._refuse(e, Call.DISPATCH)
        rc = _dispatch(self._ptr, s.din_at, s.dout_at, info, cfg, None)
        if rc:
            _lib.check(rc)
        if config is not None and config.send_only:
            # The library writes the outputs at complete: what they are must outlive this call.
            self._pending = (keep, outputs.tokens, outputs.topk_weights, outputs.scales, outputs.topk_idx,
                             inputs.tokens, inputs.topk_weights, inputs.scales, layout_info and (
                                 layout_info.expert_counters, layout_info.src_rank_counters,
                                 layout_info.expert_offsets, layout_info.recv_total_counter))

    def combine(self, inputs: CombineInputs, outputs: CombineOutputs, *, config: CombineConfig | None = None,
                stream=None) -> None:
        """Bring the expert outputs back to each token's rank and reduce them
        into ``outputs.tokens``. Collective. ``stream`` is ignored."""
        keep = []
        s = self._group._calls.s
        try:
            if not self._ptr:
                self._check_valid("combine")
            cin, cout = s.cin, s.cout  # absent tensors (None) are 0 without a call, as in dispatch
            t = inputs.tokens
            cin.tokens = 0 if t is None else address_of(t, "inputs.tokens", False, keep)
            t = inputs.topk_weights
            cin.topk_weights = 0 if t is None else address_of(t, "inputs.topk_weights", False, keep)
            t = inputs.scales
            cin.scales = 0 if t is None else address_of(t, "inputs.scales", False, keep)
            t = outputs.tokens
            cout.tokens = 0 if t is None else address_of(t, "outputs.tokens", True, keep)
            t = outputs.topk_weights
            cout.topk_weights = 0 if t is None else address_of(t, "outputs.topk_weights", True, keep)
            cfg = s.combine_config(config)
        except Exception as e:
            self._refuse(e, Call.COMBINE)
        rc = _combine(self._ptr, s.cin_at, s.cout_at, cfg, None)
        if rc:
            _lib.check(rc)
        if config is not None and config.send_only:
            self._pending = (keep, inputs.tokens, inputs.topk_weights, inputs.scales, outputs.tokens,
                             outputs.topk_weights)

    def recv_tokens(self) -> np.ndarray:
        """goep extension: the rows the latest dispatch received, where they are,
        in the group's receive buffer (no copy), as a numpy array (uint16 for
        bfloat16): LL ``[local_experts, nranks * max_tokens, hidden]``, HT
        ``[num_recv, hidden]``. Dispatch with ``DispatchOutputs(tokens=None)``
        to skip the copy into your own array. The rows may be overwritten in
        place (an expert's outputs) and passed as ``CombineInputs(tokens=...)``,
        which then reads them without a copy. The array is valid until the
        group's next dispatch (HT) or the one after (LL): do not keep it."""
        if not self._ptr:
            self._check_valid("recv_tokens")
        g = self._group
        s = g._calls.s
        rc = _recv_tokens(self._ptr, s.recv_at)
        if rc:
            _lib.check(rc)
        t, sz = s.recv, s.recv_sizes
        nd, data, dtype = t.ndim, t.data, _RECV_DTYPES[t.datatype]
        shape = (sz[0], sz[1], sz[2]) if nd == 3 else tuple(sz[:nd])
        # The group's receive buffer does not move: the array over it is made once per place and
        # shape (and made again if its caller changed it in place).
        key = (data, shape, dtype)
        arr = g._recv_views.get(key)
        if arr is not None and arr.shape == shape and arr.dtype == dtype:
            f = arr.flags
            if f.writeable and f.c_contiguous:
                return arr
        n = int(np.prod(shape))
        if n == 0:
            return np.zeros(shape, dtype=dtype)
        buf = (ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(data)
        arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
        if len(g._recv_views) >= 8:
            g._recv_views.clear()
        g._recv_views[key] = arr
        return arr

    def complete(self, *, config: int = 0, stream=None) -> None:
        """Finish a send-only dispatch or combine (collective); with nothing to
        finish, do nothing. ``config`` must be 0 (reserved, as ``nccl.ep``'s)."""
        self._check_valid("complete")
        if config:
            raise NcclInvalid(f"complete: config = {config!r} is reserved and must be 0")
        try:
            _lib.call("goepEpComplete", self._ptr, None)
        finally:
            self._pending = None

    def destroy(self) -> None:
        """Release the handle and what it holds, whatever its state: a send-only
        call not completed is completed first (its outputs not written), and an
        LL handle dispatched and not combined gives its buffers back (in the
        place of its combine: collective, as goepEpHandleDestroy says). Later
        dispatches and combines of it raise NcclInvalid here and
        NcclRemoteError on the other ranks."""
        if self._ptr:
            ptr, self._ptr, self._dead = self._ptr, 0, self._ptr
            try:
                _lib.check(_destroy(ptr))
            finally:
                self._pending = None

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"<Handle {self._ptr:#x}>" if self._ptr else "<Handle destroyed>"
