"""The C library (libgoep_ep.so) through ctypes: its structs and functions.

The struct layouts below mirror goep_ep.h; at import they are checked against
the library's own sizes (goepEpStructSize), so that a mismatch fails at once
instead of corrupting memory.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, Structure, c_char_p, c_double, c_int, c_size_t, c_uint, c_uint64, c_ulong, c_void_p
from pathlib import Path

from goep.ep.errors import NCCLError, raise_for

MAGIC = 0x60E9E9A1
TENSOR_MAGIC = 0x60E97E50
API_VERSION = 2
LIB_NAME = "libgoep_ep.so"


def _candidates() -> list[Path]:
    here = Path(__file__).resolve().parent
    paths = []
    if os.environ.get("GOEP_EP_LIB"):
        paths.append(Path(os.environ["GOEP_EP_LIB"]))
    paths.append(here / LIB_NAME)  # installed by pip with the package
    paths.append(here.parents[2] / "bin" / "capi" / LIB_NAME)  # a checkout after `make capi`
    return paths


def find_library() -> Path:
    """The library this package loads: $GOEP_EP_LIB, the one installed with
    the package, or bin/capi/ of the checkout it runs from."""
    tried = _candidates()
    for p in tried:
        if p.is_file():
            return p
    raise ImportError(
        f"goep.ep: {LIB_NAME} not found (tried {', '.join(str(p) for p in tried)}): "
        "install the package (pip install ./python builds it) or run `make capi` and set GOEP_EP_LIB"
    )


class Tensor_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("ndim", c_uint), ("datatype", c_int),
                ("data", c_void_p), ("win_hdl", c_void_p), ("win_offset", c_uint64), ("sizes", POINTER(c_size_t))]


class TensorAllocConfig_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint)]


class AllocConfig_c(Structure):
    _fields_ = [("alloc_fn", c_void_p), ("free_fn", c_void_p), ("context", c_void_p)]


_TP = POINTER(Tensor_c)
# The tensors in the call structs, as addresses (goepEpTensor_t *; the same layout as a pointer field):
# a call fills them with ints, making no ctypes pointer objects.
_T = c_void_p


class GroupConfig_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("version", c_uint), ("algorithm", c_int),
                ("num_experts", c_uint), ("max_dispatch_tokens_per_rank", c_uint),
                ("max_recv_tokens_per_rank", c_uint), ("max_token_bytes", c_uint), ("rdma_buffer_size", c_ulong),
                ("num_qp_per_rank", c_uint), ("num_channels", c_uint), ("max_num_sms", c_uint),
                ("alloc", AllocConfig_c), ("enable_mask", c_uint), ("timeout_ns", c_uint64), ("zero_copy", c_int),
                ("overflow_policy", c_int), ("num_topk", c_uint), ("padding_v2", ctypes.c_ubyte * 4)]


class GroupOptions_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("token_datatype", c_int), ("combine_quant", c_int),
                ("backend", c_char_p), ("dispatch_quant", c_int), ("dispatch_round_scales", c_uint)]


class LayoutInfo_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("expert_counters", _T), ("src_rank_counters", _T),
                ("expert_offsets", _T), ("recv_total_counter", _T), ("recv_topk_idx_kind", c_int),
                ("padding_v2", ctypes.c_ubyte * 4)]


class DispatchInputs_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("tokens", _T), ("topk_weights", _T), ("scales", _T)]


class DispatchOutputs_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("tokens", _T), ("topk_weights", _T), ("scales", _T),
                ("topk_idx", _T)]


class CombineInputs_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("tokens", _T), ("topk_weights", _T), ("scales", _T)]


class CombineOutputs_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("tokens", _T), ("topk_weights", _T)]


class HandleConfig_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("dispatch_output_per_expert_alignment", c_size_t)]


class _QuantRecipe:
    """``quantization_recipe``, nccl.ep's name of the C field ``quant_recipe``."""

    @property
    def quantization_recipe(self) -> int:
        return self.quant_recipe

    @quantization_recipe.setter
    def quantization_recipe(self, v: int) -> None:
        self.quant_recipe = v


class DispatchConfig_c(Structure, _QuantRecipe):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("send_only", c_uint), ("round_scales", c_uint),
                ("pass_direction", c_int), ("quant_recipe", c_int)]


class CombineConfig_c(Structure, _QuantRecipe):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("send_only", c_uint), ("pass_direction", c_int),
                ("quant_recipe", c_int)]


class CompleteConfig_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint)]


class MemInfo_c(Structure):
    _fields_ = [("size", c_uint), ("magic", c_uint), ("shared_per_rank", c_uint64), ("window_per_rank", c_uint64),
                ("copies_per_rank", c_uint64), ("per_node", c_uint64), ("ranks_per_node", c_uint),
                ("padding_v1", c_uint)]


_STRUCTS = {
    "goepEpTensor_t": Tensor_c, "goepEpGroupConfig_t": GroupConfig_c, "goepEpLayoutInfo_t": LayoutInfo_c,
    "goepEpDispatchInputs_t": DispatchInputs_c, "goepEpDispatchOutputs_t": DispatchOutputs_c,
    "goepEpCombineInputs_t": CombineInputs_c, "goepEpCombineOutputs_t": CombineOutputs_c,
    "goepEpHandleConfig_t": HandleConfig_c, "goepEpDispatchConfig_t": DispatchConfig_c,
    "goepEpCombineConfig_t": CombineConfig_c, "goepEpCompleteConfig_t": CompleteConfig_c, "goepEpMemInfo_t": MemInfo_c,
    "goepEpGroupOptions_t": GroupOptions_c, "goepEpTensorAllocConfig_t": TensorAllocConfig_c,
    "goepEpAllocConfig_t": AllocConfig_c,
}


def new(cls, magic: int = MAGIC, **fields):
    """A struct with its size and magic set, as the C INIT macros make it."""
    s = cls(**fields)
    s.size = ctypes.sizeof(cls)
    s.magic = magic
    return s


def comm_type():
    """The ctypes type of MPI_Comm: a pointer in Open MPI, an int in MPICH."""
    try:
        from mpi4py import MPI

        return c_void_p if MPI._sizeof(MPI.Comm) == ctypes.sizeof(c_void_p) else c_int
    except ImportError:
        return c_void_p


path = find_library()
lib = ctypes.CDLL(str(path))

lib.goepEpStructSize.restype = c_size_t
lib.goepEpStructSize.argtypes = [c_char_p]
for _name, _cls in _STRUCTS.items():
    if lib.goepEpStructSize(_name.encode()) != ctypes.sizeof(_cls):
        raise ImportError(
            f"goep.ep: {_name} is {lib.goepEpStructSize(_name.encode())} bytes in {path} but "
            f"{ctypes.sizeof(_cls)} in this package: the package and the library are of different versions"
        )

lib.goepEpGetLastError.restype = c_char_p
lib.goepEpGetLastError.argtypes = []
lib.goepEpGetErrorString.restype = c_char_p
lib.goepEpGetErrorString.argtypes = [c_int]

_G = c_void_p  # goepEpGroup_t, goepEpHandle_t: numbers, carried as pointers
_S = c_void_p  # goepEpStream_t: never read by the library
_PROTOTYPES = {
    "goepEpGetVersion": [POINTER(c_int)],
    "goepEpBufferPlan": [POINTER(GroupConfig_c), c_int, c_int, POINTER(MemInfo_c)],
    "goepEpBufferPlanWithOptions": [POINTER(GroupConfig_c), POINTER(GroupOptions_c), c_int, c_int, POINTER(MemInfo_c)],
    "goepEpCreateGroup": [POINTER(_G), comm_type(), POINTER(GroupConfig_c)],
    "goepEpCreateGroupWithOptions": [POINTER(_G), comm_type(), POINTER(GroupConfig_c), POINTER(GroupOptions_c)],
    "goepEpGroupDestroy": [_G],
    "goepEpGroupBufferBytes": [_G, POINTER(c_size_t)],
    "goepEpHandleMemSize": [_G, c_int, POINTER(HandleConfig_c), POINTER(c_size_t), c_int],
    "goepEpTensorAlloc": [POINTER(_TP), c_uint, c_int, POINTER(c_size_t), POINTER(TensorAllocConfig_c)],
    "goepEpTensorDestroy": [_TP],
    # The calls of every step take addresses (ints; byref and pointer objects are taken too).
    "goepEpCreateHandle": [c_void_p, _G, c_int, c_void_p, c_void_p, c_void_p, _S],
    "goepEpInitHandle": [POINTER(_G), _G, c_int, POINTER(HandleConfig_c), c_int, _TP],
    "goepEpUpdateHandle": [_G, c_void_p, c_void_p, _S],
    "goepEpHandleDestroy": [_G],
    "goepEpDispatch": [_G, c_void_p, c_void_p, c_void_p, c_void_p, _S],
    "goepEpCombine": [_G, c_void_p, c_void_p, c_void_p, _S],
    "goepEpComplete": [_G, POINTER(CompleteConfig_c), _S],
    "goepEpHandleRecvTokens": [_G, c_void_p],
    "goepEpMaskQuery": [_G, POINTER(c_int), _S],
    "goepEpMaskUpdate": [_G, POINTER(c_int), _S],
    "goepEpMaskClean": [_G, _S],
    "goepEpGetAsyncError": [_G, POINTER(c_int)],
    "goepEpErrorClear": [_G],
    "goepEpRefuse": [_G, _G, c_int, c_char_p],
    "goepEpBackendCount": [POINTER(c_int)],
    "goepEpBackendName": [c_int, c_char_p, c_size_t],
    "goepEpBackendSupports": [c_char_p, c_int, POINTER(c_int)],
    "goepEpBenchGoRounds": [_G, c_void_p, c_void_p, c_void_p, c_int, c_int, POINTER(c_double)],
    "goepEpBenchGoCopiedRounds": [_G, c_void_p, c_void_p, c_void_p, c_int, c_int, POINTER(c_double)],
}
for _name, _args in _PROTOTYPES.items():
    _fn = getattr(lib, _name)
    _fn.restype = c_int
    _fn.argtypes = _args

# The functions whose last parameter is a stream: call passes NULL where the caller gives none.
_STREAMED = {name for name, args in _PROTOTYPES.items() if args and args[-1] is _S}


def check(rc: int) -> None:
    """Raise the library's error class for a call's result rc (0: nothing)."""
    if rc != 0:
        raise_for(rc, lib.goepEpGetLastError().decode(errors="replace"))


def call(name: str, *args) -> None:
    """Call a function of the library; raise its error class on failure. A
    function's trailing stream may be left out: it is NULL then (the
    library never reads it)."""
    fn = getattr(lib, name)
    if name in _STREAMED and len(args) == len(fn.argtypes) - 1:
        args += (None,)
    rc = fn(*args)
    if rc != 0:
        raise_for(rc, lib.goepEpGetLastError().decode(errors="replace"))


def refuse(err, *, group=None, handle=None, call: int) -> None:
    """Take part in a call as a refusal (goepEpRefuse) because of ``err``, an
    error this package found in its caller's arguments, so that the other
    ranks' same call fails at once naming this rank, and the ranks' calls stay
    matched; then raise ``err`` (or the library's error, where the refusal
    itself failed: a group found unusable)."""
    reason = str(err) if isinstance(err, NCCLError) else f"{type(err).__name__}: {err}"
    rc = lib.goepEpRefuse(group, handle, int(call), reason.encode(errors="replace") or b"refused")
    if rc != 0 and rc not in (4, 5):  # InvalidArgument, InvalidUsage: the refusal, as meant
        try:
            raise_for(rc, lib.goepEpGetLastError().decode(errors="replace"))
        except NCCLError as e:
            raise e from err
    raise err
