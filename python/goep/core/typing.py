"""The element types and the error of ``goep.core``, where ``nccl.core.typing``
has NCCL's: ``NcclDataType`` numbered as ``ncclDataType_t``, its module
constants, and ``NcclInvalid`` (``goep.ep``'s own)."""

from enum import IntEnum

from goep.ep.errors import NcclInvalid

__all__ = [
    "NcclDataType", "NcclInvalid",
    "INT8", "CHAR", "UINT8", "INT32", "INT", "UINT32", "INT64", "UINT64", "FLOAT16", "HALF", "FLOAT32", "FLOAT",
    "FLOAT64", "DOUBLE", "BFLOAT16", "FLOAT8E4M3", "FLOAT8E5M2", "FLOAT4X2",
]


class NcclDataType(IntEnum):
    """NCCL's element types (``ncclDataType_t``), with its numbers: a member
    equals the ``goep.ep.DataType`` of the same number and may be passed
    wherever one is. FLOAT8E4M3 is the type of an FP8 dispatch's e4m3 codes
    (``GroupConfig.dispatch_quant``), FLOAT4X2 (the number NCCL reserves,
    nccl_ep.h's ``ncclFloat4x2``) that of forwarded NVFP4 rows' codes;
    FLOAT8E5M2 is taken by no call."""

    INT8 = 0
    CHAR = 0
    UINT8 = 1
    INT32 = 2
    INT = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    HALF = 6
    FLOAT32 = 7
    FLOAT = 7
    FLOAT64 = 8
    DOUBLE = 8
    BFLOAT16 = 9
    FLOAT8E4M3 = 10
    FLOAT8E5M2 = 11
    FLOAT4X2 = 12


INT8 = NcclDataType.INT8
CHAR = NcclDataType.CHAR
UINT8 = NcclDataType.UINT8
INT32 = NcclDataType.INT32
INT = NcclDataType.INT
UINT32 = NcclDataType.UINT32
INT64 = NcclDataType.INT64
UINT64 = NcclDataType.UINT64
FLOAT16 = NcclDataType.FLOAT16
HALF = NcclDataType.HALF
FLOAT32 = NcclDataType.FLOAT32
FLOAT = NcclDataType.FLOAT
FLOAT64 = NcclDataType.FLOAT64
DOUBLE = NcclDataType.DOUBLE
BFLOAT16 = NcclDataType.BFLOAT16
FLOAT8E4M3 = NcclDataType.FLOAT8E4M3
FLOAT8E5M2 = NcclDataType.FLOAT8E5M2
FLOAT4X2 = NcclDataType.FLOAT4X2
