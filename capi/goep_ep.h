/*
 * goep_ep.h: the C interface of goep's expert-parallel dispatch and combine
 * (libgoep_ep.so, built by `make capi`).
 *
 * Shaped after NCCL EP's C API (nccl_ep.h, API version 2) so that a program
 * written for it ports by renaming ncclEp to goepEp, giving an MPI
 * communicator instead of an NCCL one, and host buffers instead of device
 * ones. docs/capi.md lists every difference.
 *
 * Lifecycle (every call returns a goepEpResult_t):
 *
 *   MPI_Init_thread(...)                       the program's; goep never initialises MPI
 *   goepEpCreateGroup(&group, comm, &config)   collective over comm
 *   goepEpCreateHandle(&handle, group, layout, &topk_idx, NULL, NULL)   per step, local
 *   goepEpDispatch(handle, &in, &out, &layout_info, NULL)              collective
 *   ... the experts run on the received rows ...
 *   goepEpCombine(handle, &expert_out, &combined, NULL)                 collective
 *   goepEpHandleDestroy(handle)
 *   goepEpGroupDestroy(group)                  collective
 *   MPI_Finalize()                             the program's
 *
 * Memory, ownership and lifetimes
 *
 *   - Every tensor is a descriptor (goepEpTensor_t) of the caller's host
 *     memory: a data pointer, an element type and a shape. The caller owns
 *     the memory, the descriptor and its `sizes` array; the library keeps no
 *     pointer to any of them after the call returns, except that a
 *     send-only call (send_only = 1) reads its inputs and writes its outputs
 *     until goepEpComplete returns: they must stay valid until then.
 *   - Descriptors are checked before anything is read or written: size and
 *     magic, element type, number of dimensions and every extent against the
 *     group's configuration; a bad one is goepEpInvalidArgument naming it,
 *     and nothing is written.
 *   - Groups and handles are opaque numbers, not pointers into the library:
 *     a destroyed or never created one is refused with goepEpInvalidArgument
 *     (never a crash). Destroying a group makes its handles invalid.
 *   - The library owns the group's buffers (MPI shared-memory segments and
 *     windows), sized at goepEpCreateGroup and released by
 *     goepEpGroupDestroy; goepEpBufferPlan says how large before anything is
 *     allocated.
 *   - Every struct starts with its size and a magic number (initialise it
 *     with its GOEP_EP_..._INIT macro); structs only grow at their end, and
 *     the library reads only the fields a struct's size covers.
 *
 * Errors
 *
 *   A call that fails returns a code other than goepEpSuccess;
 *   goepEpGetLastError() gives a readable message for the last failure on
 *   the calling thread, naming the bad value. Nothing in the library exits
 *   the process or unwinds across the call: an internal fault is
 *   goepEpInternalError. A peer that stops or stalls makes the others'
 *   collective calls return goepEpTimeout after timeout_ns, naming it where
 *   it can; the group is then unusable and must be destroyed (which then
 *   returns at once).
 *
 *   A call refused on one rank fails on every rank: bad input found by this
 *   library (a descriptor, an expert id) or by the layer above it
 *   (goepEpRefuse) is goepEpInvalidArgument or goepEpInvalidUsage there and
 *   goepEpRemoteError on the others, naming the rank and the reason, and the
 *   group stays usable. A refused goepEpCreateHandle counts too: the
 *   dispatch the handle would have made fails on every rank (the refusing
 *   rank takes part in it at its next goepEpCreateHandle, goepEpDispatch or
 *   goepEpGroupDestroy). Handles are numbered in the order they are created
 *   (refused ones included), and every call carries its number and kind in
 *   what it exchanges anyway: where a rank skips a call, or makes one the
 *   others do not, every rank's call fails with goepEpMismatch naming a rank
 *   and the call, and the group is unusable. No call ever returns a result
 *   paired with another rank's different step.
 *
 * Threads
 *
 *   A group may be used from any thread, one call at a time (calls on one
 *   group are serialised by the library). The library calls MPI from the
 *   calling thread: initialise MPI with MPI_THREAD_MULTIPLE (mpi4py's
 *   default), or call only from the thread your MPI thread level allows.
 *   Collective calls must be made by every rank of the group in the same
 *   order.
 */
#ifndef GOEP_EP_H
#define GOEP_EP_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GOEP_EP_MAJOR 0
#define GOEP_EP_MINOR 1
#define GOEP_EP_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH, as goepEpGetVersion returns it. */
#define GOEP_EP_VERSION_CODE (GOEP_EP_MAJOR * 10000 + GOEP_EP_MINOR * 100 + GOEP_EP_PATCH)

/* The version of the structs below; a group config carries the caller's in
 * `version`, and the library refuses a newer one than it knows. */
#define GOEP_EP_API_VERSION 1
#define GOEP_EP_MAGIC 0x60E9E9A1u
#define GOEP_EP_TENSOR_MAGIC 0x60E97E50u
#define GOEP_EP_AUTO 0

/* Result codes. The values shared with NCCL's ncclResult_t mean the same. */
typedef enum {
    goepEpSuccess = 0,
    goepEpSystemError = 2,      /* MPI or the operating system failed (the message names the call) */
    goepEpInternalError = 3,    /* a fault inside the library, caught (please report it) */
    goepEpInvalidArgument = 4,  /* a bad value: NULL, a struct of the wrong size or magic, a tensor of the wrong
                                   type or shape, an expert id out of range, a destroyed group or handle */
    goepEpInvalidUsage = 5,     /* a call out of order or not offered: goepEpComplete with nothing to
                                   complete, masking on a group without enable_mask, a layout goep lacks */
    goepEpRemoteError = 6,      /* another rank refused the same collective call (its input was bad): this
                                   call wrote nothing and the group stays usable */
    goepEpTimeout = 64,         /* a peer did not arrive within timeout_ns: the group is unusable */
    goepEpMasked = 65,          /* (enable_mask) the other ranks masked this one after it stalled; it rejoins
                                   with goepEpMaskClean, called with them */
    goepEpMismatch = 66         /* the ranks' calls no longer match (a rank skipped a call, or made one or
                                   created a handle that the others did not): no result was returned, and the
                                   group is unusable on every rank */
} goepEpResult_t;

/* What goepEpRefuse stands for. */
typedef enum {
    GOEP_EP_CALL_CREATE_HANDLE = 1,
    GOEP_EP_CALL_DISPATCH = 2,
    GOEP_EP_CALL_COMBINE = 3
} goepEpCall_t;

/* Element types, numbered as NCCL's ncclDataType_t. */
typedef enum {
    goepEpInt8 = 0,
    goepEpUint8 = 1,
    goepEpInt32 = 2,
    goepEpUint32 = 3,
    goepEpInt64 = 4,
    goepEpUint64 = 5,
    goepEpFloat16 = 6,
    goepEpFloat32 = 7,
    goepEpFloat64 = 8,
    goepEpBfloat16 = 9
} goepEpDataType_t;

typedef enum {
    GOEP_EP_ALGO_LOW_LATENCY = 0,   /* LL: decode, up to a few hundred tokens per rank */
    GOEP_EP_ALGO_HIGH_THROUGHPUT = 1 /* HT: training and prefill, thousands of tokens per rank */
} goepEpAlgorithm_t;

/* Receive layouts. goep offers LL EXPERT_MAJOR and HT FLAT; the others are
 * refused with goepEpInvalidUsage. */
typedef enum {
    GOEP_EP_LAYOUT_UNSET = GOEP_EP_AUTO,
    /* LL: dispatch writes tokens [local_experts, nranks * max_dispatch_tokens_per_rank, hidden]; the first
     * expert_counters[l] rows of expert l are valid, grouped by source rank in rank order, each group in
     * token order. Combine takes the expert outputs in the same shape and returns
     * out[t] = sum over k of topk_weights[t][k] * (expert output of the row of (t, k)). */
    GOEP_EP_LAYOUT_EXPERT_MAJOR = 1,
    GOEP_EP_LAYOUT_RANK_MAJOR = 2, /* not offered */
    /* HT: dispatch writes the received tokens [num_recv, hidden], grouped by source rank then token, with
     * their top-k weights [num_recv, num_topk] (zero where the expert is elsewhere) and expert ids
     * [num_recv, num_topk] (-1 where the expert is elsewhere). The experts apply the weights; combine sums
     * the rows each rank returns into out[t]. */
    GOEP_EP_LAYOUT_FLAT = 3
} goepEpLayout_t;

typedef enum { GOEP_EP_FWD_PASS = 0, GOEP_EP_BWD_PASS = 1 } goepEpPassDir_t;

/* How dispatch numbers the received expert ids (HT FLAT's topk_idx output). */
typedef enum {
    GOEP_EP_EXPERT_ID_AUTO = GOEP_EP_AUTO, /* LOCAL */
    GOEP_EP_EXPERT_ID_LOCAL = 1,           /* 0 .. local_experts-1, -1 = elsewhere */
    GOEP_EP_EXPERT_ID_GLOBAL = 2           /* rank * local_experts + local id, -1 = elsewhere */
} goepEpExpertIdKind_t;

/* Only NONE: quantised dispatch is a group setting in goep's Go API, not offered here yet. */
typedef enum { GOEP_EP_DISPATCH_QUANT_NONE = 0 } goepEpDispatchQuantizationRecipe_t;
typedef enum { GOEP_EP_COMBINE_QUANT_NONE = 0 } goepEpCombineQuantizationRecipe_t;

#define GOEP_EP_STRUCT_INIT(type_, magic_) ((type_){.size = (unsigned int)sizeof(type_), .magic = (magic_)})
#if defined(__cplusplus)
#define GOEP_EP_STATIC_ASSERT(cond_, msg_) static_assert((cond_), msg_)
#else
#define GOEP_EP_STATIC_ASSERT(cond_, msg_) _Static_assert((cond_), msg_)
#endif

/* A tensor: `ndim` extents in `sizes` (row-major, the last one contiguous) of `datatype` elements at
 * `data`, in the caller's host memory. Neither the memory nor `sizes` is copied or kept (but see
 * send_only). `data` may be NULL only when the tensor has no elements, and must be aligned to its
 * element size. */
typedef struct goepEpTensor {
    unsigned int size;  /* sizeof(goepEpTensor_t) */
    unsigned int magic; /* GOEP_EP_TENSOR_MAGIC */
    unsigned int ndim;  /* 1..8 */
    goepEpDataType_t datatype;
    void* data;
    const size_t* sizes; /* ndim extents, owned by the caller */
} goepEpTensor_t;
#define GOEP_EP_TENSOR_INIT GOEP_EP_STRUCT_INIT(goepEpTensor_t, GOEP_EP_TENSOR_MAGIC)
#define GOEP_EP_TENSOR_V1_SIZE 32u

/* A group's configuration: the same on every rank (checked). */
typedef struct {
    unsigned int size;    /* sizeof(goepEpGroupConfig_t) */
    unsigned int magic;   /* GOEP_EP_MAGIC */
    unsigned int version; /* GOEP_EP_API_VERSION the caller was built against */
    goepEpAlgorithm_t algorithm;
    unsigned int num_experts;                  /* a multiple of the number of ranks; rank r owns experts
                                                  [r*L, (r+1)*L), L = num_experts / nranks */
    unsigned int max_dispatch_tokens_per_rank; /* > 0 */
    unsigned int max_recv_tokens_per_rank;     /* HT: bound on the rows one rank receives (AUTO: nranks *
                                                  max_dispatch_tokens_per_rank); LL: ignored */
    unsigned int max_token_bytes;              /* bytes of one token row: hidden * element size */
    unsigned int num_topk;                     /* experts per token, 1..min(num_experts, 64); required (NCCL EP
                                                  takes it from each handle's topk_idx) */
    goepEpDataType_t datatype;                 /* token element type: goepEpBfloat16 or goepEpFloat32 */
    unsigned int enable_mask;                  /* LL only: a rank that stalls past timeout_ns is masked, not an
                                                  error (goepEpMaskQuery, goepEpGetAsyncError) */
    unsigned int padding_v1;
    uint64_t timeout_ns; /* bound on every wait for a peer; AUTO: 60 s */
} goepEpGroupConfig_t;
#define GOEP_EP_GROUP_CONFIG_INIT \
    ((goepEpGroupConfig_t){.size = (unsigned int)sizeof(goepEpGroupConfig_t), .magic = GOEP_EP_MAGIC, \
                           .version = GOEP_EP_API_VERSION})
#define GOEP_EP_GROUP_CONFIG_V1_SIZE 56u

/* Counters a dispatch writes (IN/OUT: the descriptors are the caller's, the counts are written into their
 * memory). Each field may be NULL. */
typedef struct {
    unsigned int size;
    unsigned int magic;
    goepEpTensor_t* expert_counters;    /* [local_experts] int32 or int64: rows received per local expert.
                                           Required by an LL EXPERT_MAJOR dispatch. */
    goepEpTensor_t* src_rank_counters;  /* RANK_MAJOR only: not offered, must be NULL */
    goepEpTensor_t* expert_offsets;     /* HT EXPERT_MAJOR only: not offered, must be NULL */
    goepEpTensor_t* recv_total_counter; /* [1] int32 or int64: rows received (HT FLAT) or their sum (LL) */
    goepEpExpertIdKind_t recv_topk_idx_kind;
    unsigned char padding_v1[4];
} goepEpLayoutInfo_t;
#define GOEP_EP_LAYOUT_INFO_INIT GOEP_EP_STRUCT_INIT(goepEpLayoutInfo_t, GOEP_EP_MAGIC)
#define GOEP_EP_LAYOUT_INFO_V1_SIZE 48u

typedef struct {
    unsigned int size;
    unsigned int magic;
    goepEpTensor_t* tokens;       /* required: [num_tokens, hidden], the group's datatype */
    goepEpTensor_t* topk_weights; /* [num_tokens, num_topk] float32: the gate weights. HT: required by the
                                     handle's first dispatch. LL: optional here (combine's
                                     outputs->topk_weights may give them instead). A later dispatch of the
                                     same handle without them keeps the earlier ones. */
    goepEpTensor_t* scales;       /* must be NULL (no quantisation recipe) */
} goepEpDispatchInputs_t;
#define GOEP_EP_DISPATCH_INPUTS_INIT GOEP_EP_STRUCT_INIT(goepEpDispatchInputs_t, GOEP_EP_MAGIC)
#define GOEP_EP_DISPATCH_INPUTS_V1_SIZE 32u

typedef struct {
    unsigned int size;
    unsigned int magic;
    goepEpTensor_t* tokens;       /* LL EXPERT_MAJOR: [local_experts, nranks * max_dispatch_tokens_per_rank,
                                     hidden]; only each expert's first expert_counters[l] rows are written.
                                     HT FLAT: [slots, hidden] with slots at least the rows received
                                     (max_recv_tokens_per_rank always is); only the first num_recv rows are
                                     written. NULL (a goep extension): nothing is copied; the rows stay in the
                                     group's buffer, read in place with goepEpHandleRecvTokens. */
    goepEpTensor_t* topk_weights; /* HT FLAT: [slots, num_topk] float32, optional. LL: must be NULL. */
    goepEpTensor_t* scales;       /* must be NULL */
    goepEpTensor_t* topk_idx;     /* HT FLAT: [slots, num_topk] int32 or int64, optional. LL: must be NULL. */
} goepEpDispatchOutputs_t;
#define GOEP_EP_DISPATCH_OUTPUTS_INIT GOEP_EP_STRUCT_INIT(goepEpDispatchOutputs_t, GOEP_EP_MAGIC)
#define GOEP_EP_DISPATCH_OUTPUTS_V1_SIZE 40u

typedef struct {
    unsigned int size;
    unsigned int magic;
    goepEpTensor_t* tokens;       /* required: the expert outputs, shaped as the dispatch's outputs->tokens
                                     (HT: at least num_recv rows; the first num_recv are read) */
    goepEpTensor_t* topk_weights; /* HT only: [slots, num_topk] float32, one value per received (row, slot),
                                     summed back to each token's (t, k) into outputs->topk_weights (the
                                     gradient of the gate weights in a backward pass). */
} goepEpCombineInputs_t;
#define GOEP_EP_COMBINE_INPUTS_INIT GOEP_EP_STRUCT_INIT(goepEpCombineInputs_t, GOEP_EP_MAGIC)
#define GOEP_EP_COMBINE_INPUTS_V1_SIZE 24u

typedef struct {
    unsigned int size;
    unsigned int magic;
    goepEpTensor_t* tokens;       /* required: [num_tokens, hidden], in the handle's token order */
    goepEpTensor_t* topk_weights; /* [num_tokens, num_topk] float32. LL: the weights combine applies (all ones:
                                     an unweighted sum); NULL uses the dispatch's. HT: written with
                                     inputs->topk_weights' sums; must be given with it. */
} goepEpCombineOutputs_t;
#define GOEP_EP_COMBINE_OUTPUTS_INIT GOEP_EP_STRUCT_INIT(goepEpCombineOutputs_t, GOEP_EP_MAGIC)
#define GOEP_EP_COMBINE_OUTPUTS_V1_SIZE 24u

typedef struct {
    unsigned int size;
    unsigned int magic;
    size_t dispatch_output_per_expert_alignment; /* HT EXPERT_MAJOR only: must be 0 or 1 */
} goepEpHandleConfig_t;
#define GOEP_EP_HANDLE_CONFIG_INIT GOEP_EP_STRUCT_INIT(goepEpHandleConfig_t, GOEP_EP_MAGIC)
#define GOEP_EP_HANDLE_CONFIG_V1_SIZE 16u

typedef struct {
    unsigned int size;
    unsigned int magic;
    unsigned int send_only;          /* 1: send, and let goepEpComplete receive (compute may run between) */
    unsigned int round_scales;       /* must be 0 */
    goepEpPassDir_t pass_direction;  /* HT BWD: a later dispatch of the handle's routing, without weights */
    goepEpDispatchQuantizationRecipe_t quantization_recipe; /* must be NONE */
} goepEpDispatchConfig_t;
#define GOEP_EP_DISPATCH_CONFIG_INIT GOEP_EP_STRUCT_INIT(goepEpDispatchConfig_t, GOEP_EP_MAGIC)
#define GOEP_EP_DISPATCH_CONFIG_V1_SIZE 24u

typedef struct {
    unsigned int size;
    unsigned int magic;
    unsigned int send_only;          /* 1: send, and let goepEpComplete receive and reduce */
    goepEpPassDir_t pass_direction;  /* HT BWD requires inputs->topk_weights and outputs->topk_weights */
    goepEpCombineQuantizationRecipe_t quantization_recipe; /* must be NONE */
} goepEpCombineConfig_t;
#define GOEP_EP_COMBINE_CONFIG_INIT GOEP_EP_STRUCT_INIT(goepEpCombineConfig_t, GOEP_EP_MAGIC)
#define GOEP_EP_COMBINE_CONFIG_V1_SIZE 20u

typedef struct goepEpCompleteConfig {
    unsigned int size;
    unsigned int magic;
} goepEpCompleteConfig_t;
#define GOEP_EP_COMPLETE_CONFIG_INIT GOEP_EP_STRUCT_INIT(goepEpCompleteConfig_t, GOEP_EP_MAGIC)
#define GOEP_EP_COMPLETE_CONFIG_V1_SIZE 8u

/* The memory a group holds, per rank and per node (goepEpBufferPlan). */
typedef struct {
    unsigned int size;
    unsigned int magic;
    uint64_t shared_per_rank; /* each rank's shared-memory segment, mapped by its node's ranks */
    uint64_t window_per_rank; /* each rank's staging memory for other nodes' rows (0 on one node) */
    uint64_t copies_per_rank; /* bound on the message copies across nodes a rank holds at once */
    uint64_t per_node;        /* what the most loaded node holds in all */
    unsigned int ranks_per_node;
    unsigned int padding_v1;
} goepEpMemInfo_t;
#define GOEP_EP_MEM_INFO_INIT GOEP_EP_STRUCT_INIT(goepEpMemInfo_t, GOEP_EP_MAGIC)
#define GOEP_EP_MEM_INFO_V1_SIZE 48u

GOEP_EP_STATIC_ASSERT(sizeof(goepEpTensor_t) == GOEP_EP_TENSOR_V1_SIZE, "goepEpTensor_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpGroupConfig_t) == GOEP_EP_GROUP_CONFIG_V1_SIZE, "goepEpGroupConfig_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpLayoutInfo_t) == GOEP_EP_LAYOUT_INFO_V1_SIZE, "goepEpLayoutInfo_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpDispatchInputs_t) == GOEP_EP_DISPATCH_INPUTS_V1_SIZE, "goepEpDispatchInputs_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpDispatchOutputs_t) == GOEP_EP_DISPATCH_OUTPUTS_V1_SIZE, "goepEpDispatchOutputs_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpCombineInputs_t) == GOEP_EP_COMBINE_INPUTS_V1_SIZE, "goepEpCombineInputs_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpCombineOutputs_t) == GOEP_EP_COMBINE_OUTPUTS_V1_SIZE, "goepEpCombineOutputs_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpHandleConfig_t) == GOEP_EP_HANDLE_CONFIG_V1_SIZE, "goepEpHandleConfig_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpDispatchConfig_t) == GOEP_EP_DISPATCH_CONFIG_V1_SIZE, "goepEpDispatchConfig_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpCombineConfig_t) == GOEP_EP_COMBINE_CONFIG_V1_SIZE, "goepEpCombineConfig_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpCompleteConfig_t) == GOEP_EP_COMPLETE_CONFIG_V1_SIZE, "goepEpCompleteConfig_t layout");
GOEP_EP_STATIC_ASSERT(sizeof(goepEpMemInfo_t) == GOEP_EP_MEM_INFO_V1_SIZE, "goepEpMemInfo_t layout");

/* Opaque handles: numbers the library hands out, never dereferenced by the caller. */
typedef struct goepEpGroup* goepEpGroup_t;
typedef struct goepEpHandle* goepEpHandle_t;

#ifndef GOEP_EP_NO_PROTOTYPES /* the library's own build declares them from Go */

/* The library's GOEP_EP_VERSION_CODE (compare with the header's). */
goepEpResult_t goepEpGetVersion(int* version);

/* A short name for a result code ("goepEpInvalidArgument: ..."); never NULL. */
const char* goepEpGetErrorString(goepEpResult_t result);

/* The message of the last failed call on this thread ("" if none): valid until this thread's next failed
 * call. Successful calls leave it as it was. */
const char* goepEpGetLastError(void);

/* The memory a group of `config` would hold over nranks ranks on nnodes nodes (nodes as equal as can be),
 * computed without allocating anything or calling MPI. Not collective. */
goepEpResult_t goepEpBufferPlan(const goepEpGroupConfig_t* config, int nranks, int nnodes, goepEpMemInfo_t* info);

/* Create a group over the ranks of comm (collective over them, with the same config on every rank).
 * comm stays the caller's: the group works on a duplicate of it and the caller may free comm once
 * goepEpCreateGroup returns. MPI must be initialised; goep never initialises or finalises it. A rank that
 * does not call within timeout_ns is named in the others' goepEpTimeout. */
goepEpResult_t goepEpCreateGroup(goepEpGroup_t* group, MPI_Comm comm, const goepEpGroupConfig_t* config);

/* Release a group and its buffers (collective). Its handles become invalid. If a rank does not call it
 * within timeout_ns, it returns goepEpTimeout naming that rank, frees nothing, and may be called again. */
goepEpResult_t goepEpGroupDestroy(goepEpGroup_t group);

/* The bytes of buffers the group holds on this rank. Not collective. */
goepEpResult_t goepEpGroupBufferBytes(goepEpGroup_t group, size_t* bytes);

/* The host bytes a handle of this layout and top-k holds at most (its copy of the routing). */
goepEpResult_t goepEpHandleMemSize(goepEpGroup_t group, goepEpLayout_t layout, const goepEpHandleConfig_t* config,
                                   size_t* size_out, int num_topk);

/* Create a handle for one step's routing: topk_idx is [num_tokens, num_topk] int32 or int64 expert ids
 * (-1 = none), copied and checked (ids in range, none repeated in a token, num_tokens at most
 * max_dispatch_tokens_per_rank). Local: not collective, but numbered: every rank creates its handles of a
 * group in the same order (its n-th handle stands for the same step on every rank). A refused one (bad
 * topk_idx) makes the dispatch it stood for fail on every rank, this rank taking part in it at its next
 * goepEpCreateHandle, goepEpDispatch or goepEpGroupDestroy. layout_info must be NULL (goep writes the
 * counters at dispatch); config may be NULL. */
goepEpResult_t goepEpCreateHandle(goepEpHandle_t* handle, goepEpGroup_t group, goepEpLayout_t layout,
                                  const goepEpTensor_t* topk_idx, const goepEpLayoutInfo_t* layout_info,
                                  const goepEpHandleConfig_t* config);

/* Release a handle and what it holds, whatever its state. A send-only dispatch or combine of the handle
 * that goepEpComplete has not finished is finished first (without writing its outputs): collective, as
 * goepEpComplete. An LL handle dispatched and not combined gives back its receive buffers, which the
 * second dispatch after it would otherwise be refused for: collective, in the place of its combine (every
 * rank destroys it; where some ranks combine it instead, every rank fails with goepEpMismatch). Otherwise
 * local. The handle is released even when the call fails; a call on it afterwards is refused, on every
 * rank, as a destroyed handle. */
goepEpResult_t goepEpHandleDestroy(goepEpHandle_t handle);

/* Send each token to the ranks owning its experts and write what this rank receives into outputs
 * (collective). The handle's first dispatch routes by its topk_idx; a later one reuses that routing
 * (cached: no layout or count exchange). With config->send_only, only the sending half runs and
 * goepEpComplete receives; inputs may be reused when the call returns, outputs and layout_info are
 * written by goepEpComplete. config may be NULL. */
goepEpResult_t goepEpDispatch(goepEpHandle_t handle, const goepEpDispatchInputs_t* inputs,
                              const goepEpDispatchOutputs_t* outputs, const goepEpLayoutInfo_t* layout_info,
                              const goepEpDispatchConfig_t* config);

/* Bring the expert outputs back to each token's rank and reduce them into outputs->tokens (collective).
 * With config->send_only, goepEpComplete receives and reduces. config may be NULL. */
goepEpResult_t goepEpCombine(goepEpHandle_t handle, const goepEpCombineInputs_t* inputs,
                             const goepEpCombineOutputs_t* outputs, const goepEpCombineConfig_t* config);

/* goep extension: describe in *tokens the rows the handle's latest dispatch received, where they are, in
 * the group's receive buffer: no copy, as a Go program reads them. tokens must be initialised
 * (GOEP_EP_TENSOR_INIT) with sizes pointing at 3 size_t of the caller's; the call sets ndim, datatype,
 * data and sizes: LL [local_experts, nranks * max_dispatch_tokens_per_rank, hidden] (the first
 * expert_counters[l] rows of expert l valid), HT [num_recv, hidden]. The rows may be read and
 * overwritten in place (an expert's outputs), and passed as the combine's inputs->tokens, which then
 * reads them without a copy. They stay there until the group's next dispatch (HT) or the one after
 * (LL); a later call refuses a handle whose rows are gone. The library owns the memory: never free it. */
goepEpResult_t goepEpHandleRecvTokens(goepEpHandle_t handle, goepEpTensor_t* tokens);

/* Finish the handle's send-only dispatch or combine (collective, as the call it finishes). With nothing
 * to finish it does nothing and succeeds. config may be NULL. */
goepEpResult_t goepEpComplete(goepEpHandle_t handle, const goepEpCompleteConfig_t* config);

/* goep extension: take part in a call as a refusal with `reason`, for a layer above this library that checks
 * its callers' arguments itself (the Python package does, for arrays it cannot describe): the other ranks'
 * same call fails with goepEpRemoteError naming this rank and reason, and the ranks' calls stay matched,
 * as when the library refuses an argument itself. call is GOEP_EP_CALL_DISPATCH or GOEP_EP_CALL_COMBINE
 * of `handle` (collective, as the call; a destroyed handle of a live group is accepted), or
 * GOEP_EP_CALL_CREATE_HANDLE on `group` (local, as a refused goepEpCreateHandle: the dispatch the handle
 * stood for fails on every rank). The other argument may be NULL. Returns goepEpInvalidArgument with reason
 * as the last error, or the error that kept the call from being refused (a group found unusable: its code). */
goepEpResult_t goepEpRefuse(goepEpGroup_t group, goepEpHandle_t handle, goepEpCall_t call, const char* reason);

/* Masking (groups with enable_mask). mask_status and mask are int[nranks] in host memory, 1 = active,
 * 0 = masked. MaskQuery is local. MaskUpdate makes `mask` the mask: collective over the ranks it leaves
 * active, which pass the same mask. MaskClean makes every rank active again: collective over every rank,
 * a masked one that came back included. Neither clears the async error flag. */
goepEpResult_t goepEpMaskQuery(goepEpGroup_t group, int* mask_status);
goepEpResult_t goepEpMaskUpdate(goepEpGroup_t group, const int* mask);
goepEpResult_t goepEpMaskClean(goepEpGroup_t group);

/* The async error flag (groups with enable_mask): *error_out = 1 once a call has masked a rank that
 * stalled, until goepEpErrorClear. Local. */
goepEpResult_t goepEpGetAsyncError(goepEpGroup_t group, int* error_out);
goepEpResult_t goepEpErrorClear(goepEpGroup_t group);

/* For bindings (the Python package checks its struct layouts with it): sizeof the named struct type as
 * the library was built ("goepEpTensor_t", ...), 0 for a name it does not know. */
size_t goepEpStructSize(const char* type_name);

#endif /* GOEP_EP_NO_PROTOTYPES */

#ifdef __cplusplus
}
#endif
#endif /* GOEP_EP_H */
