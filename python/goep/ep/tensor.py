"""``Tensor``: a goepEpTensor_t descriptor of host memory the caller owns.

A Tensor describes memory in place, never copying it, from any of:

- a numpy array (C-contiguous; its dtype gives the element type, and uint16
  arrays hold bfloat16 bits, since numpy has no bfloat16);
- a PyTorch tensor in host memory (contiguous, dense; ``torch.bfloat16``,
  ``float16``, ``float32``, ``float64``, ``int8``, ``uint8``, ``int32``,
  ``int64``). torch is never imported here: a tensor of it exists only where
  the program has imported it;
- an object with ``__dlpack__``/``__dlpack_device__`` whose memory is on the
  host (kDLCPU, kDLCUDAHost): its capsule is read with ctypes and kept with
  the Tensor, so the producer's memory stays alive as long as the Tensor;
- an object with ``__array_interface__`` (version 3);
- a raw address, with ``dtype=`` and ``shape=``.

Device memory (``__cuda_array_interface__``, DLPack kDLCUDA and the like, a
torch tensor on a GPU) is refused naming what was passed: goep's CPU engine
reads and writes host memory. So is memory that is not laid out row-major
without gaps, since the library reads it as such.

A call describes each numpy array and torch tensor it is passed once and
reuses the description while the object lives unchanged (a weak reference
to it is kept for that; numpy's in-place ``ndarray.resize`` refuses an array
with weak references: use ``np.resize`` or a new array).
"""

from __future__ import annotations

import ctypes
import numbers
import sys
import weakref
from typing import NamedTuple

import numpy as np

from goep.ep import _lib
from goep.ep.enums import DataType
from goep.ep.errors import NcclInvalid

__all__ = ["Tensor", "as_tensor"]

_FROM_NUMPY = {
    np.dtype(np.int8): DataType.INT8,
    np.dtype(np.uint8): DataType.UINT8,
    np.dtype(np.int32): DataType.INT32,
    np.dtype(np.uint32): DataType.UINT32,
    np.dtype(np.int64): DataType.INT64,
    np.dtype(np.uint64): DataType.UINT64,
    np.dtype(np.float16): DataType.FLOAT16,
    np.dtype(np.float32): DataType.FLOAT32,
    np.dtype(np.float64): DataType.FLOAT64,
    # numpy has no bfloat16: bfloat16 rows are kept as their uint16 bit patterns.
    np.dtype(np.uint16): DataType.BFLOAT16,
}

_ITEMSIZE = {DataType.INT8: 1, DataType.UINT8: 1, DataType.INT32: 4, DataType.UINT32: 4, DataType.INT64: 8,
             DataType.UINT64: 8, DataType.FLOAT16: 2, DataType.FLOAT32: 4, DataType.FLOAT64: 8, DataType.BFLOAT16: 2,
             DataType.FLOAT8E4M3: 1, DataType.FLOAT8E5M2: 1, DataType.FLOAT4X2: 1}


def datatype_of(dt: np.dtype) -> DataType:
    """The DataType of a numpy dtype: uint16 (and ml_dtypes' bfloat16) is bfloat16."""
    if dt.name == "bfloat16":
        return DataType.BFLOAT16
    if dt.name == "float8_e4m3fn":  # ml_dtypes'
        return DataType.FLOAT8E4M3
    try:
        return _FROM_NUMPY[dt]
    except KeyError:
        raise NcclInvalid(f"numpy dtype {dt} has no goep element type (want int8/16/32/64, float16/32/64, "
                          "or uint16 holding bfloat16 bits)") from None


def _datatype_or_why(dt: np.dtype) -> DataType | str:
    try:
        return datatype_of(dt)
    except NcclInvalid as e:
        return e.message


def _datatype_arg(dtype, name: str) -> DataType:
    """dtype= as a DataType (any IntEnum of NCCL's numbers, or an int)."""
    try:
        return DataType(int(dtype))
    except (TypeError, ValueError):
        label = getattr(dtype, "name", None) or repr(dtype)
        raise NcclInvalid(f"{name}: dtype={label} ({dtype!r}) has no goep element type (want one of "
                          f"{', '.join(d.name for d in DataType)})") from None


class _View(NamedTuple):
    """What a resolver found: the address of the first element, the sizes, the
    element type (or, where it has none, why: dtype= may still name one), the
    element size in bytes, whether the memory is read-only, and what must
    outlive the Tensor."""

    data: int
    sizes: tuple
    datatype: DataType | str
    itemsize: int
    readonly: bool
    owner: object


def _c_contiguous(sizes, strides, itemsize: int = 1) -> bool:
    """Whether strides (in units of itemsize) walk sizes row-major without gaps;
    the stride of a dimension of size 1 does not matter, nor any of an empty one."""
    if any(s == 0 for s in sizes):
        return True
    want = itemsize
    for n, st in zip(reversed(sizes), reversed(strides)):
        if n != 1 and st != want:
            return False
        want *= n
    return True


def _from_numpy(arr: np.ndarray, name: str, owner) -> _View:
    if not arr.flags.c_contiguous:
        raise NcclInvalid(f"{name} is not C-contiguous (shape {arr.shape}, strides {arr.strides}): "
                          "pass np.ascontiguousarray of it")
    return _View(arr.ctypes.data, tuple(arr.shape), _datatype_or_why(arr.dtype), arr.itemsize,
                 not arr.flags.writeable, owner)


def _torch_datatypes(torch) -> dict:
    return {torch.bfloat16: DataType.BFLOAT16, torch.float16: DataType.FLOAT16, torch.float32: DataType.FLOAT32,
            torch.float64: DataType.FLOAT64, torch.int8: DataType.INT8, torch.uint8: DataType.UINT8,
            torch.int32: DataType.INT32, torch.int64: DataType.INT64}


def _from_torch(t, torch, name: str) -> _View:
    if t.layout != torch.strided:
        raise NcclInvalid(f"{name} is a torch tensor of layout {t.layout}: want a dense one (torch.strided)")
    if t.device.type != "cpu":
        raise NcclInvalid(f"{name} is a torch tensor on {t.device}, not in host memory: goep's CPU engine reads "
                          "and writes host memory only; pass a CPU tensor")
    if (hasattr(t, "is_neg") and t.is_neg()) or (hasattr(t, "is_conj") and t.is_conj()):
        raise NcclInvalid(f"{name} is a torch view whose negation or conjugation is not yet applied to its memory: "
                          "pass .resolve_neg() / .resolve_conj() of it")
    dt = _torch_datatypes(torch).get(t.dtype)
    if dt is None:
        raise NcclInvalid(f"{name} is a torch tensor of dtype {t.dtype}, which has no goep element type (want "
                          "torch.bfloat16, float16, float32, float64, int8, uint8, int32 or int64)")
    if not t.is_contiguous():
        raise NcclInvalid(f"{name} is a torch tensor that is not contiguous (shape {tuple(t.shape)}, strides "
                          f"{tuple(t.stride())}): pass .contiguous() of it")
    return _View(t.data_ptr(), tuple(t.shape), dt, t.element_size(), False, t)


# DLPack's C structs (dlpack.h), read with ctypes.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_DL_FLAG_READ_ONLY = 1
_DL_HOST = {1: "kDLCPU", 3: "kDLCUDAHost"}
_DL_DEVICES = {2: "kDLCUDA", 4: "kDLOpenCL", 7: "kDLVulkan", 8: "kDLMetal", 9: "kDLVPI", 10: "kDLROCM",
               11: "kDLROCMHost", 12: "kDLExtDev", 13: "kDLCUDAManaged", 14: "kDLOneAPI", 15: "kDLWebGPU",
               16: "kDLHexagon"}
# (type code, bits) -> element type. kDLUInt 16 holds bfloat16 bits, as numpy's uint16 does.
_FROM_DLPACK = {(0, 8): DataType.INT8, (0, 32): DataType.INT32, (0, 64): DataType.INT64, (1, 8): DataType.UINT8,
                (1, 16): DataType.BFLOAT16, (1, 32): DataType.UINT32, (1, 64): DataType.UINT64,
                (2, 16): DataType.FLOAT16, (2, 32): DataType.FLOAT32, (2, 64): DataType.FLOAT64,
                (4, 16): DataType.BFLOAT16}
_DL_CODES = {0: "kDLInt", 1: "kDLUInt", 2: "kDLFloat", 3: "kDLOpaqueHandle", 4: "kDLBfloat", 5: "kDLComplex",
             6: "kDLBool"}

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def _dl_device_name(kind: int) -> str:
    return _DL_HOST.get(kind) or _DL_DEVICES.get(kind) or f"device type {kind}"


def _from_dlpack(obj, name: str) -> _View:
    what = f"{name} (a {type(obj).__name__}, through DLPack)"
    try:
        kind, dev_id = obj.__dlpack_device__()
    except Exception as e:
        raise NcclInvalid(f"{what}: __dlpack_device__ failed: {type(e).__name__}: {e}") from e
    if int(kind) not in _DL_HOST:
        raise NcclInvalid(f"{what} is in {_dl_device_name(int(kind))} memory (device {dev_id}), not on the host: "
                          "goep's CPU engine reads and writes host memory only (kDLCPU, kDLCUDAHost)")
    try:
        capsule = obj.__dlpack__()
    except Exception as e:
        raise NcclInvalid(f"{what}: __dlpack__ failed: {type(e).__name__}: {e}") from e
    cname = _capsule_name(capsule)
    if cname == b"dltensor":
        dl = _DLManagedTensor.from_address(_capsule_pointer(capsule, cname)).dl_tensor
        readonly = False
    elif cname == b"dltensor_versioned":
        m = _DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, cname))
        if m.major != 1:
            raise NcclInvalid(f"{what}: DLPack version {m.major}.{m.minor}, want 1.x")
        dl, readonly = m.dl_tensor, bool(m.flags & _DL_FLAG_READ_ONLY)
    else:
        raise NcclInvalid(f"{what}: __dlpack__ gave a capsule named {cname!r}, want 'dltensor' (an unused one)")
    if dl.device.device_type not in _DL_HOST:
        raise NcclInvalid(f"{what}: its DLTensor is in {_dl_device_name(dl.device.device_type)} memory, "
                          "not on the host: goep's CPU engine reads and writes host memory only")
    sizes = tuple(int(dl.shape[i]) for i in range(dl.ndim))
    code, bits, lanes = dl.dtype.code, dl.dtype.bits, dl.dtype.lanes
    dt = _FROM_DLPACK.get((code, bits))
    if dt is None or lanes != 1:
        raise NcclInvalid(f"{what} has elements {_DL_CODES.get(code, f'code {code}')} of {bits} bits x {lanes} "
                          "lanes, which have no goep element type")
    if dl.strides:
        strides = tuple(int(dl.strides[i]) for i in range(dl.ndim))
        if not _c_contiguous(sizes, strides):
            raise NcclInvalid(f"{what} is not C-contiguous (shape {sizes}, strides {strides} elements)")
    data = (dl.data or 0) + dl.byte_offset
    # The capsule's destructor calls the producer's deleter: holding it holds the memory.
    return _View(data, sizes, dt, bits // 8, readonly, (obj, capsule))


def _from_array_interface(obj, name: str) -> _View:
    what = f"{name} (a {type(obj).__name__}, through __array_interface__)"
    ai = obj.__array_interface__
    if not isinstance(ai, dict) or ai.get("version") != 3:
        raise NcclInvalid(f"{what}: want an __array_interface__ dict of version 3, got version "
                          f"{ai.get('version') if isinstance(ai, dict) else type(ai).__name__}")
    if ai.get("mask") is not None:
        raise NcclInvalid(f"{what} has a mask: goep reads every element")
    data = ai.get("data")
    if not isinstance(data, tuple):
        # The memory is a buffer object (or obj itself): numpy describes it in place.
        return _from_numpy(np.asarray(obj), what, obj)
    try:
        dt = np.dtype(ai["typestr"])
        sizes = tuple(int(n) for n in ai["shape"])
    except (KeyError, TypeError) as e:
        raise NcclInvalid(f"{what}: bad shape or typestr: {e}") from e
    if not dt.isnative and dt.itemsize > 1:
        raise NcclInvalid(f"{what} has typestr {ai['typestr']!r}, not in this machine's byte order")
    strides = ai.get("strides")
    if strides is not None and not _c_contiguous(sizes, tuple(strides), dt.itemsize):
        raise NcclInvalid(f"{what} is not C-contiguous (shape {sizes}, strides {tuple(strides)} bytes)")
    return _View(int(data[0] or 0), sizes, _datatype_or_why(dt), dt.itemsize, bool(data[1]), obj)


def _has(obj, attr: str) -> bool:
    """Whether obj offers attr (a property that raises counts as absent)."""
    try:
        getattr(obj, attr)
    except Exception:
        return False
    return True


def _resolve(buffer, name: str, writable: bool) -> _View:
    """The memory buffer describes, in place."""
    if isinstance(buffer, np.ndarray):
        return _from_numpy(buffer, name, buffer)
    torch = sys.modules.get("torch")  # present wherever a torch tensor is
    if torch is not None and isinstance(buffer, torch.Tensor):
        return _from_torch(buffer, torch, name)
    if _has(buffer, "__cuda_array_interface__"):
        raise NcclInvalid(f"{name} is a {type(buffer).__name__} with __cuda_array_interface__ (device memory): "
                          "goep's CPU engine reads and writes host memory only")
    if hasattr(buffer, "__dlpack__") and hasattr(buffer, "__dlpack_device__"):
        return _from_dlpack(buffer, name)
    if hasattr(buffer, "__array_interface__"):
        return _from_array_interface(buffer, name)
    try:
        memoryview(buffer)
    except TypeError:
        # A list, a scalar, an object with only __array__: numpy may copy it, and a call writing into
        # the copy would leave the caller's object as it was.
        if writable:
            raise NcclInvalid(f"{name} is a {type(buffer).__name__}, which goep cannot describe in place, and the "
                              "call writes into it: pass a numpy array, a torch tensor or a DLPack object") from None
        return _from_numpy(np.asarray(buffer), name, None)
    return _from_numpy(np.asarray(buffer), name, buffer)  # the buffer protocol: a view, no copy


class Tensor:
    """A descriptor of host memory the caller owns: a numpy array, a PyTorch
    CPU tensor, a DLPack or ``__array_interface__`` object (see the module's
    docstring), or a raw address with ``dtype`` and ``shape``. The memory is
    described in place, never copied; the Tensor keeps the object it
    describes (and a DLPack capsule) alive.

    ``dtype`` with an object overrides its element type where the element
    sizes agree (an ``ml_dtypes`` or ``'<V2'`` array as ``BFLOAT16``, say).
    ``window`` and ``window_offset`` are nccl.ep's (both or neither): goep
    has no registered windows, so a window is refused. ``writable``: the call
    writes into it (read-only memory is refused). ``name`` names it in errors.
    """

    def __init__(self, buffer, *, dtype=None, shape: tuple[int, ...] | None = None, window=None,
                 window_offset: int | None = None, writable: bool = False, name: str = "tensor") -> None:
        if window is not None and window_offset is None:
            raise NcclInvalid(f"{name}: window= needs window_offset= (in bytes)")
        if window is None and window_offset is not None:
            raise NcclInvalid(f"{name}: window_offset= is only valid with window=")
        if window is not None:
            raise NcclInvalid(f"{name}: window={window!r}: goep has no registered windows (its engine reads and "
                              "writes host memory through its own buffers); describe the memory without one")
        if isinstance(buffer, numbers.Integral) and not isinstance(buffer, bool):
            if dtype is None or shape is None:
                raise NcclInvalid(f"{name}: a raw address needs dtype= and shape=")
            sizes = tuple(int(s) for s in shape)
            if any(s < 0 for s in sizes):
                raise NcclInvalid(f"{name}: shape={tuple(shape)} has a negative size")
            data, self._datatype, self._readonly, self._buffer, self._owner = (
                int(buffer), _datatype_arg(dtype, name), False, None, None)
        else:
            if shape is not None:
                raise NcclInvalid(f"{name}: shape= is for a raw address; an object's own shape is described")
            v = _resolve(buffer, name, writable)
            if dtype is not None:
                self._datatype = _datatype_arg(dtype, name)
            elif isinstance(v.datatype, str):
                raise NcclInvalid(f"{name}: {v.datatype}; or pass dtype=")
            else:
                self._datatype = v.datatype
            if _ITEMSIZE[self._datatype] != v.itemsize:
                raise NcclInvalid(f"{name}: dtype={self._datatype.name} has {_ITEMSIZE[self._datatype]}-byte "
                                  f"elements but the memory's are {v.itemsize} bytes")
            if writable and v.readonly:
                raise NcclInvalid(f"{name} is read-only, and the call writes into it")
            if not v.sizes:
                raise NcclInvalid(f"{name} is a scalar; want an array of 1 to 8 dimensions")
            data, sizes, self._readonly, self._buffer, self._owner = v.data, v.sizes, v.readonly, buffer, v.owner
        self._sizes = sizes
        self._sizes_c = (ctypes.c_size_t * len(sizes))(*sizes)
        self._c = _lib.new(_lib.Tensor_c, _lib.TENSOR_MAGIC, ndim=len(sizes), datatype=int(self._datatype),
                           data=data, sizes=self._sizes_c)
        self._address = ctypes.addressof(self._c)

    @property
    def ptr(self) -> ctypes.pointer:
        """The descriptor, for the library."""
        return ctypes.pointer(self._c)

    @property
    def address(self) -> int:
        """The descriptor's address (a ``goepEpTensor_t *``), valid while the
        Tensor lives."""
        return self._address

    @property
    def sizes(self) -> tuple[int, ...]:
        """The size of each dimension, outermost first."""
        return self._sizes

    @property
    def shape(self) -> tuple[int, ...]:
        """The same as :attr:`sizes`, as numpy names it."""
        return self._sizes

    @property
    def ndim(self) -> int:
        return len(self._sizes)

    @property
    def datatype(self) -> DataType:
        return self._datatype

    @property
    def data(self) -> int:
        """The address of the first element."""
        return self._c.data or 0

    @property
    def buffer(self):
        """The object described (None for a raw address)."""
        return self._buffer

    @property
    def readonly(self) -> bool:
        """Whether the memory is known to be read-only (a call may not write it)."""
        return self._readonly

    def __repr__(self) -> str:
        return f"<Tensor sizes={self._sizes} dtype={self._datatype.name} data={self.data:#x}>"


def as_tensor(x, name: str, writable: bool = False) -> Tensor | None:
    """x as a Tensor: None stays None, a Tensor stays itself, anything else is described."""
    if x is None or isinstance(x, Tensor):
        if isinstance(x, Tensor) and writable and x.readonly:
            raise NcclInvalid(f"{name} is read-only, and the call writes into it")
        return x
    return Tensor(x, writable=writable, name=name)


class _Described:
    """A cached descriptor of a numpy array or a torch tensor: the C struct
    (which holds its sizes), its address, and what the object looked like
    when it was described."""

    __slots__ = ("ref", "c", "address", "shape", "strides", "dtype", "base", "data")


# The descriptors of the arrays a program passes call after call (the same
# outputs, the same expert buffers every step), made once and found by the
# object's id. An entry is used only while its object is alive (a weak
# reference: the cache never keeps an array alive, and an entry goes when its
# object does) and unchanged in what fixes its memory: a numpy array's shape,
# strides, dtype and base (its data moves in place only with a new base: numpy
# refuses to resize an array that has weak references), a torch tensor's
# data_ptr, shape, dtype and contiguity. Anything else is described at each
# call.
_described: dict[int, _Described] = {}
_DESCRIBED_MAX = 4096


def _forget(oid: int, ref) -> None:
    e = _described.get(oid)
    if e is not None and e.ref is ref:
        del _described[oid]


def _remember(x, t: Tensor) -> None:
    oid = id(x)
    e = _Described()
    try:
        e.ref = weakref.ref(x, lambda ref, oid=oid: _forget(oid, ref))
    except TypeError:  # an object without weak references: not cached
        return
    e.c, e.address = t._c, t._address
    if type(x) is np.ndarray:
        e.shape, e.strides, e.dtype, e.base, e.data = x.shape, x.strides, x.dtype, x.base, None
    else:
        e.shape, e.strides, e.dtype, e.base, e.data = x.shape, None, x.dtype, None, x.data_ptr()
    if len(_described) >= _DESCRIBED_MAX:
        _described.clear()
    _described[oid] = e


def address_of(x, name: str, writable: bool, keep: list) -> int:
    """The address of a goepEpTensor_t describing x (0 for None), for a call:
    a numpy array's or a torch tensor's from the cache where it is there and
    still true, otherwise described as :class:`Tensor` does (and then
    cached). The descriptor is appended to keep, which the caller holds until
    the call returns: the cache may drop an entry (full, or its object
    changed) while the call still needs its address.
    Raises :class:`NcclInvalid` as Tensor does."""
    if x is None:
        return 0
    tx = type(x)
    if tx is Tensor:
        if writable and x._readonly:
            raise NcclInvalid(f"{name} is read-only, and the call writes into it")
        return x._address
    e = _described.get(id(x))
    if e is not None and e.ref() is x:
        if tx is np.ndarray:
            if (x.base is e.base and x.shape == e.shape and x.strides == e.strides and x.dtype == e.dtype
                    and (not writable or x.flags.writeable)):
                keep.append(e.c)
                return e.address
        elif (x.data_ptr() == e.data and x.shape == e.shape and x.dtype is e.dtype and x.is_contiguous()):
            keep.append(e.c)
            return e.address
    t = Tensor(x, writable=writable, name=name)
    keep.append(t)
    if tx is np.ndarray or (t._owner is x and _is_torch(x)):
        _remember(x, t)
    return t._address


def _is_torch(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)
