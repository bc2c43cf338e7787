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
from dataclasses import dataclass
from typing import Any

import numpy as np

from goep.ep import _lib
from goep.ep.enums import Call, CombineQuantizationRecipe, DataType, DispatchQuantizationRecipe, ExpertIdKind, PassDir
from goep.ep.errors import NcclInvalid
from goep.ep.tensor import Tensor, as_tensor

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
    and ``scales`` ``[num_tokens, ceil(hidden / 128)]`` float32; otherwise
    ``scales`` is None."""

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
    the layout's leading dimensions then ``ceil(hidden / 128)``."""

    tokens: TensorLike = None
    topk_weights: TensorLike = None
    scales: TensorLike = None
    topk_idx: TensorLike = None


@dataclass
class CombineInputs:
    """``tokens``: the expert outputs, shaped as the dispatch's output tokens;
    HT ``topk_weights`` ``[slots, num_topk]``: values summed back per slot."""

    tokens: TensorLike = None
    topk_weights: TensorLike = None


@dataclass
class CombineOutputs:
    """``tokens`` ``[num_tokens, hidden]``; ``topk_weights`` ``[num_tokens, num_topk]``
    float32: LL, the weights applied; HT, the sums of the inputs' values."""

    tokens: TensorLike = None
    topk_weights: TensorLike = None


def _ptr(t: Tensor | None):
    return t.ptr if t is not None else None


def _cfg_ptr(c):
    return ctypes.pointer(c._c()) if c is not None else None


class Handle:
    """One step's routing: created by :meth:`Group.create_handle`, released by
    :meth:`destroy`. A second dispatch of the same handle reuses its routing
    (a cached dispatch)."""

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
        try:
            t = as_tensor(topk_idx, "topk_idx")
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
        _lib.call("goepEpUpdateHandle", self._ptr, t.ptr if t is not None else None, None, None)
        self._no_routing = None

    def dispatch(self, inputs: DispatchInputs, outputs: DispatchOutputs, *, layout_info: LayoutInfo | None = None,
                 config: DispatchConfig | None = None, stream=None) -> None:
        """Send each token to the ranks owning its experts and write what this
        rank receives into ``outputs`` (and the counters into ``layout_info``).
        Collective. ``stream`` is ignored (host memory, synchronous calls)."""
        keep = []

        def t(x, name, writable=False):
            tt = as_tensor(x, name, writable)
            keep.append(tt)
            return tt

        try:
            self._check_valid("dispatch")
            if self._no_routing is not None:
                raise NcclInvalid(f"dispatch: the handle has no routing: {self._no_routing}; update it first",
                                  status=5)
            cin = _lib.new(_lib.DispatchInputs_c, tokens=_ptr(t(inputs.tokens, "inputs.tokens")),
                           topk_weights=_ptr(t(inputs.topk_weights, "inputs.topk_weights")),
                           scales=_ptr(t(inputs.scales, "inputs.scales")))
            cout = _lib.new(_lib.DispatchOutputs_c, tokens=_ptr(t(outputs.tokens, "outputs.tokens", True)),
                            topk_weights=_ptr(t(outputs.topk_weights, "outputs.topk_weights", True)),
                            scales=_ptr(t(outputs.scales, "outputs.scales", True)),
                            topk_idx=_ptr(t(outputs.topk_idx, "outputs.topk_idx", True)))
            info = None
            if layout_info is not None:
                li = layout_info
                info = ctypes.pointer(_lib.new(
                    _lib.LayoutInfo_c,
                    expert_counters=_ptr(t(li.expert_counters, "layout_info.expert_counters", True)),
                    src_rank_counters=_ptr(t(li.src_rank_counters, "layout_info.src_rank_counters", True)),
                    expert_offsets=_ptr(t(li.expert_offsets, "layout_info.expert_offsets", True)),
                    recv_total_counter=_ptr(t(li.recv_total_counter, "layout_info.recv_total_counter", True)),
                    recv_topk_idx_kind=int(li.recv_topk_idx_kind)))
            cfg = _cfg_ptr(config)
        except Exception as e:
            self._refuse(e, Call.DISPATCH)
        _lib.call("goepEpDispatch", self._ptr, ctypes.byref(cin), ctypes.byref(cout), info, cfg)
        if config is not None and config.send_only:
            self._pending = keep

    def combine(self, inputs: CombineInputs, outputs: CombineOutputs, *, config: CombineConfig | None = None,
                stream=None) -> None:
        """Bring the expert outputs back to each token's rank and reduce them
        into ``outputs.tokens``. Collective. ``stream`` is ignored."""
        try:
            self._check_valid("combine")
            keep = [as_tensor(inputs.tokens, "inputs.tokens"), as_tensor(inputs.topk_weights, "inputs.topk_weights"),
                    as_tensor(outputs.tokens, "outputs.tokens", True),
                    as_tensor(outputs.topk_weights, "outputs.topk_weights", True)]
            cin = _lib.new(_lib.CombineInputs_c, tokens=_ptr(keep[0]), topk_weights=_ptr(keep[1]))
            cout = _lib.new(_lib.CombineOutputs_c, tokens=_ptr(keep[2]), topk_weights=_ptr(keep[3]))
            cfg = _cfg_ptr(config)
        except Exception as e:
            self._refuse(e, Call.COMBINE)
        _lib.call("goepEpCombine", self._ptr, ctypes.byref(cin), ctypes.byref(cout), cfg)
        if config is not None and config.send_only:
            self._pending = keep

    def recv_tokens(self) -> np.ndarray:
        """goep extension: the rows the latest dispatch received, where they are,
        in the group's receive buffer (no copy), as a numpy array (uint16 for
        bfloat16): LL ``[local_experts, nranks * max_tokens, hidden]``, HT
        ``[num_recv, hidden]``. Dispatch with ``DispatchOutputs(tokens=None)``
        to skip the copy into your own array. The rows may be overwritten in
        place (an expert's outputs) and passed as ``CombineInputs(tokens=...)``,
        which then reads them without a copy. The array is valid until the
        group's next dispatch (HT) or the one after (LL): do not keep it."""
        self._check_valid("recv_tokens")
        sizes = (ctypes.c_size_t * 3)()
        t = _lib.new(_lib.Tensor_c, _lib.TENSOR_MAGIC, sizes=sizes)
        _lib.call("goepEpHandleRecvTokens", self._ptr, ctypes.byref(t))
        shape = tuple(sizes[: t.ndim])
        dtype = np.uint16 if t.datatype == DataType.BFLOAT16 else np.float32
        n = int(np.prod(shape))
        if n == 0:
            return np.zeros(shape, dtype=dtype)
        buf = (ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(t.data)
        return np.frombuffer(buf, dtype=dtype).reshape(shape)

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
                _lib.call("goepEpHandleDestroy", ptr)
            finally:
                self._pending = None

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return f"<Handle {self._ptr:#x}>" if self._ptr else "<Handle destroyed>"
