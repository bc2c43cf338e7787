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
    """The receive layout of a handle (``goepEpLayout_t``): LL groups take
    ``EXPERT_MAJOR`` or ``RANK_MAJOR``, HT groups ``FLAT`` or ``EXPERT_MAJOR``,
    where the backend declares them (:func:`goep.ep.backend_supports`). The
    group's first handle sets it for the group (its buffers are laid out for
    it): a later handle with another is refused.
    """

    UNSET = 0
    EXPERT_MAJOR = 1
    """LL: tokens ``[local_experts, nranks * max_dispatch_tokens_per_rank, hidden]``;
    the first ``expert_counters[l]`` rows of expert ``l`` are valid. HT: tokens
    ``[slots, hidden]`` in zones, one per local expert, starting at
    ``expert_offsets[l]`` and padded (zero rows) to
    ``HandleConfig.dispatch_output_per_expert_alignment``; ``topk_weights``
    ``[slots]``, one per row."""

    RANK_MAJOR = 2
    """LL: tokens ``[nranks, max_dispatch_tokens_per_rank, hidden]``, the first
    ``src_rank_counters[r]`` rows of rank ``r`` valid, with their ``topk_weights``
    and ``topk_idx`` ``[nranks, max_dispatch_tokens_per_rank, num_topk]``; the
    experts apply the weights and combine sums."""

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
    """How a dispatch moves its rows (``goepEpDispQuant_t``). goep fixes it
    per group (``GroupConfig.dispatch_quant``): a dispatch's
    ``DispatchConfig.quantization_recipe`` is NONE (the group's) or the
    group's own. nccl.ep forwards any payload with FWD, told by the tokens'
    type at each dispatch; goep's group names its payload (its buffers hold
    rows of one size, and a payload the backend lacks is refused when the
    group is made): FWD for e4m3 codes, FWD_NVFP4 for NVFP4 rows, whose
    dispatches may still pass FWD."""

    NONE = 0
    FWD = 1
    """The caller's e4m3 codes (``FLOAT8E4M3``) and float32 scales, one per
    128 elements, forwarded as they are."""
    DS_FP8E3M4 = 2
    """The rows cast to e4m3 with a float32 scale per 128 elements
    (``round_scales``: powers of two); received as codes and scales."""
    FWD_NVFP4 = 0x100
    """goep: nccl.ep's FWD with ``FLOAT4X2`` tokens, as a group's recipe: the
    caller's FP4 e2m1 codes, ``[num_tokens, hidden / 2]`` ``FLOAT4X2`` (two a
    byte, element 2i in the low nibble), and one e4m3 scale byte per 16
    elements, ``[num_tokens, hidden / 16]`` ``UINT8`` (or ``FLOAT8E4M3``),
    forwarded as they are; hidden a multiple of 32."""


class CombineQuantizationRecipe(IntEnum):
    """How a combine moves the expert outputs (``goepEpCombQuant_t``), a
    group setting in goep (``GroupConfig.combine_quant``): a combine's
    ``CombineConfig.quantization_recipe`` is NONE (the group's) or the
    group's own."""

    NONE = 0
    NVFP4 = 1
    """LL EXPERT_MAJOR: each valid output row as FP4 e2m1 codes with an e4m3
    scale per 16 elements and a float32 row scale amax/2688, computed by
    goep; ``CombineInputs(scales=...)``, nccl.ep's global scales, is None or
    checked against each row (``goep_ep.h``, ``goepEpCombineInputs_t``)."""
    FP8 = 0x100
    """goep: e4m3 codes with a float32 scale per 128 elements (LL and HT)."""
    FP8_UE8M0 = 0x101


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
    FLOAT8E4M3 = 10
    """e4m3 codes: an FP8 dispatch's tokens (a uint8 array with dtype=FLOAT8E4M3)."""
    FLOAT8E5M2 = 11
    FLOAT4X2 = 12
    """Two FP4 e2m1 codes a byte (NCCL's reserved number, nccl_ep.h's
    ``ncclFloat4x2``): forwarded NVFP4 rows, ``[rows, hidden / 2]`` (a uint8
    array with dtype=FLOAT4X2)."""


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
