"""``Tensor``: a goepEpTensor_t descriptor of a numpy array (or raw host memory)."""

from __future__ import annotations

import ctypes
import numbers

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
             DataType.UINT64: 8, DataType.FLOAT16: 2, DataType.FLOAT32: 4, DataType.FLOAT64: 8, DataType.BFLOAT16: 2}


def datatype_of(dt: np.dtype) -> DataType:
    """The DataType of a numpy dtype: uint16 (and ml_dtypes' bfloat16) is bfloat16."""
    if dt.name == "bfloat16":
        return DataType.BFLOAT16
    try:
        return _FROM_NUMPY[dt]
    except KeyError:
        raise NcclInvalid(f"numpy dtype {dt} has no goep element type (want int8/16/32/64, float16/32/64, "
                          "or uint16 holding bfloat16 bits)") from None


class Tensor:
    """A descriptor of host memory the caller owns: a numpy array (C-contiguous,
    its dtype giving the element type: uint16 arrays are bfloat16), or a raw
    address with ``dtype`` and ``shape``. The caller keeps the memory alive;
    the Tensor keeps a reference to the array it describes.
    """

    def __init__(self, buffer, *, dtype: DataType | int | None = None, shape: tuple[int, ...] | None = None,
                 writable: bool = False, name: str = "tensor") -> None:
        if isinstance(buffer, numbers.Integral) and not isinstance(buffer, bool):
            if dtype is None or shape is None:
                raise NcclInvalid(f"{name}: a raw address needs dtype= and shape=")
            data, sizes, self._datatype, self._buffer = int(buffer), tuple(int(s) for s in shape), DataType(dtype), None
        else:
            arr = buffer if isinstance(buffer, np.ndarray) else np.asarray(buffer)
            if not arr.flags.c_contiguous:
                raise NcclInvalid(f"{name} is not C-contiguous (shape {arr.shape}, strides {arr.strides}): "
                                  "pass np.ascontiguousarray of it")
            if writable and not arr.flags.writeable:
                raise NcclInvalid(f"{name} is read-only, and the call writes into it")
            if arr.ndim == 0:
                raise NcclInvalid(f"{name} is a scalar; want an array of 1 to 8 dimensions")
            self._datatype = datatype_of(arr.dtype) if dtype is None else DataType(dtype)
            if _ITEMSIZE[self._datatype] != arr.itemsize:
                raise NcclInvalid(f"{name}: dtype={self._datatype.name} has {_ITEMSIZE[self._datatype]}-byte elements "
                                  f"but the array's are {arr.itemsize} bytes ({arr.dtype})")
            data, sizes, self._buffer = arr.ctypes.data, tuple(arr.shape), arr
        self._sizes = sizes
        self._sizes_c = (ctypes.c_size_t * len(sizes))(*sizes)
        self._c = _lib.new(_lib.Tensor_c, _lib.TENSOR_MAGIC, ndim=len(sizes), datatype=int(self._datatype),
                           data=data, sizes=self._sizes_c)

    @property
    def ptr(self) -> ctypes.pointer:
        """The descriptor, for the library."""
        return ctypes.pointer(self._c)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def datatype(self) -> DataType:
        return self._datatype

    @property
    def data(self) -> int:
        """The address of the first element."""
        return self._c.data or 0

    @property
    def buffer(self):
        """The array described (None for a raw address)."""
        return self._buffer

    def __repr__(self) -> str:
        return f"<Tensor shape={self._sizes} dtype={self._datatype.name} data={self.data:#x}>"


def as_tensor(x, name: str, writable: bool = False) -> Tensor | None:
    """x as a Tensor: None stays None, a Tensor stays itself, an array is described."""
    if x is None or isinstance(x, Tensor):
        if isinstance(x, Tensor) and writable and x.buffer is not None and not x.buffer.flags.writeable:
            raise NcclInvalid(f"{name} is read-only, and the call writes into it")
        return x
    return Tensor(x, writable=writable, name=name)
