"""Enums of the C interface (goep_ep.h), named and numbered as ``nccl.ep``'s."""

from enum import IntEnum

__all__ = [
    "Algorithm",
    "Call",
    "CombineQuantizationRecipe",
    "DataType",
    "DispatchQuantizationRecipe",
    "ExpertIdKind",
    "Layout",
    "OverflowPolicy",
    "PassDir",
    "Result",
    "ZeroCopyMode",
]


class Algorithm(IntEnum):
    """The group's mode (``goepEpAlgorithm_t``)."""

    LOW_LATENCY = 0
    """LL: decode, up to a few hundred tokens per rank, expert-major buffers."""

    HIGH_THROUGHPUT = 1
    """HT: training and prefill, thousands of tokens per rank, once per rank."""


class Layout(IntEnum):
    """The receive layout of a handle (``goepEpLayout_t``).

    goep offers ``EXPERT_MAJOR`` in LL groups and ``FLAT`` in HT groups.
    """

    UNSET = 0
    EXPERT_MAJOR = 1
    """LL: tokens ``[local_experts, nranks * max_dispatch_tokens_per_rank, hidden]``;
    the first ``expert_counters[l]`` rows of expert ``l`` are valid."""

    RANK_MAJOR = 2
    """Not offered by goep."""

    FLAT = 3
    """HT: tokens ``[num_recv, hidden]`` with their ``topk_weights`` and
    ``topk_idx`` ``[num_recv, num_topk]``."""


class PassDir(IntEnum):
    """Forward or backward pass (``goepEpPassDir_t``); HT only."""

    FWD = 0
    BWD = 1


class ExpertIdKind(IntEnum):
    """How an HT dispatch numbers the received expert ids."""

    AUTO = 0
    LOCAL = 1
    GLOBAL = 2


class DispatchQuantizationRecipe(IntEnum):
    NONE = 0


class CombineQuantizationRecipe(IntEnum):
    NONE = 0


class OverflowPolicy(IntEnum):
    """What an HT dispatch does with rows beyond ``max_recv_tokens_per_rank``
    (``GroupConfig.overflow_policy``), numbered as NCCL's
    ``ncclEpOverflowPolicy_t`` (the long names are its generated bindings').

    DROP drops those rows, the same on every rank (they add nothing to the
    combine); AUTO and TRAP fail such a dispatch on every rank (an error, as
    TRAP's abort is in NCCL EP)."""

    AUTO = 0
    """TRAP."""
    TRAP = 1
    DROP = 2
    OVERFLOW_AUTO = 0
    OVERFLOW_TRAP = 1
    OVERFLOW_DROP = 2


class ZeroCopyMode(IntEnum):
    """Whether NCCL EP bypasses its staging buffers for window-backed tensors
    (``GroupConfig.zero_copy``), numbered as ``ncclEpZeroCopyMode_t``.

    AUTO and OFF are accepted; ON is refused: goep has no registered windows
    (a Tensor with ``window=`` is refused), and its own way without copies is
    ``DispatchOutputs(tokens=None)`` with :meth:`Handle.recv_tokens`."""

    AUTO = 0
    """OFF."""
    OFF = 1
    ON = 2
    ZERO_COPY_AUTO = 0
    ZERO_COPY_OFF = 1
    ZERO_COPY_ON = 2


class DataType(IntEnum):
    """Element types (``goepEpDataType_t``), numbered as NCCL's ``ncclDataType_t``."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9


class Result(IntEnum):
    """Result codes of the C interface (``goepEpResult_t``)."""

    Success = 0
    SystemError = 2
    InternalError = 3
    InvalidArgument = 4
    InvalidUsage = 5
    RemoteError = 6
    Timeout = 64
    Masked = 65
    Mismatch = 66


class Call(IntEnum):
    """What a refusal stands for (``goepEpCall_t``, :func:`goep.ep._lib.refuse`)."""

    CREATE_HANDLE = 1
    DISPATCH = 2
    COMBINE = 3


class Feature(IntEnum):
    """goep extension: an optional behaviour a backend declares
    (``goepEpFeature_t``; Go's ``ep.Feature``, same numbers and names):
    :func:`goep.ep.backends` lists each backend's."""

    FP8_WIRE = 1
    MASK_STALLED_RANKS = 2
    FP8_FORWARD = 3
    FP8_COMBINE = 4
    OVERFLOW_DROP = 5
    REFUSALS = 6
    METER = 7
    NAMED_TIMEOUTS = 8
    ZERO_ALLOCS = 9
    HT_EXPERT_MAJOR = 10
    LL_RANK_MAJOR = 11
    GLOBAL_EXPERT_IDS = 12
    CALL_SEQUENCE = 13
    NVFP4_FORWARD = 14
    NVFP4_COMBINE = 15
