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
 *   goepEpCreateHandle(&handle, group, layout, &topk_idx, NULL, NULL, NULL)   per step, local
 *     (or once goepEpInitHandle, then per step goepEpUpdateHandle(handle, &topk_idx, NULL, NULL))
 *   goepEpDispatch(handle, &in, &out, &layout_info, NULL, NULL)              collective
 *   ... the experts run on the received rows ...
 *   goepEpCombine(handle, &expert_out, &combined, NULL, NULL)                 collective
 *   goepEpHandleDestroy(handle)
 *   goepEpGroupDestroy(group)                  collective
 *   MPI_Finalize()                             the program's
 *
 * Memory, ownership and lifetimes
 *
 *   - Every tensor is a descriptor (goepEpTensor_t) of the caller's host
 *     memory: a data pointer, an element type and a shape. The caller owns
 *     the memory, the descriptor and its `sizes` array (goepEpTensorAlloc
 *     makes a descriptor with its sizes in one allocation, freed by
 *     goepEpTensorDestroy); the library keeps no pointer to any of them
 *     after the call returns, except that a send-only call (send_only = 1)
 *     reads its inputs and writes its outputs until goepEpComplete returns,
 *     and a handle keeps its handle_mem (goepEpInitHandle) until it is
 *     destroyed: they must stay valid until then.
 *   - Streams (goepEpStream_t, the type of CUDA's cudaStream_t) are
 *     accepted and never dereferenced: pass NULL, or the program's stream.
 *     Every call runs on the calling thread and is finished (its outputs
 *     written, or the sending half done with send_only) when it returns,
 *     so whatever order a stream stands for is already kept.
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

/* ABI and API versions.
 *
 * Every struct passed on its own begins with `unsigned int size` and `unsigned int magic`; the group
 * config also carries `version`, the GOEP_EP_API_VERSION the caller was built against, and the
 * library refuses a newer one than its own. Structs only ever grow at their end: the library takes any
 * struct at least as large as its first released version (its *_V1_SIZE), reads only the fields its
 * `size` covers (GOEP_EP_HAS_FIELD), and ignores a newer caller's tail. Each released version's end
 * (*_Vn_SIZE, *_Vn_LAST_FIELD) never moves; where a version ended in padding the compiler would add, a
 * named padding_vN member takes those bytes so that no later field can land in them. The layouts are
 * NCCL EP's, byte for byte (capi/tests/abi.c checks them); the magic numbers are goep's own, and the
 * GOEP_EP_..._INIT macros fill them in. */
#define GOEP_EP_API_VERSION 2
#define GOEP_EP_MAGIC 0x60E9E9A1u
#define GOEP_EP_AUTO 0

/* A compound literal of type_ with its size and magic set: in a declaration, an assignment or an
 * expression. Other fields are zero (AUTO, NULL). */
#define GOEP_EP_STRUCT_INIT(type_, magic_) ((type_){.size = (unsigned int)sizeof(type_), .magic = (magic_)})

/* The byte just past field_ in type_, and whether the struct at ptr_ is large enough to hold field_. */
#define GOEP_EP_FIELD_END(type_, field_) ((unsigned int)(offsetof(type_, field_) + sizeof(((type_*)0)->field_)))
#define GOEP_EP_HAS_FIELD(ptr_, type_, field_) ((ptr_) != NULL && (ptr_)->size >= GOEP_EP_FIELD_END(type_, field_))

#if defined(__cplusplus)
#define GOEP_EP_STATIC_ASSERT(cond_, msg_) static_assert((cond_), msg_)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define GOEP_EP_STATIC_ASSERT(cond_, msg_) _Static_assert((cond_), msg_)
#else
#define GOEP_EP_STATIC_ASSERT(cond_, msg_) extern int goep_ep_static_assert_unavailable_
#endif

/* base_##_V<n>_SIZE and base_##_V<n>_LAST_FIELD, with n a macro expanded first. */
#define GOEP_EP_VERSION_SIZE_(base_, n_) base_##_V##n_##_SIZE
#define GOEP_EP_VERSION_SIZE(base_, n_) GOEP_EP_VERSION_SIZE_(base_, n_)
#define GOEP_EP_VERSION_LAST_(base_, n_) base_##_V##n_##_LAST_FIELD
#define GOEP_EP_VERSION_LAST(base_, n_) GOEP_EP_VERSION_LAST_(base_, n_)

/* Compile-time checks of a versioned struct type_ whose macros are named base_##...: size and magic
 * lead, its current version is no newer than the API's, and sizeof is that version's size. */
#define GOEP_EP_STATIC_ASSERT_STRUCT_ABI(type_, base_)                                                         \
    GOEP_EP_STATIC_ASSERT(offsetof(type_, size) == 0, #type_ ": size is not its first field");               \
    GOEP_EP_STATIC_ASSERT(offsetof(type_, magic) == GOEP_EP_FIELD_END(type_, size),                          \
                          #type_ ": magic does not follow size");                                             \
    GOEP_EP_STATIC_ASSERT(base_##_CURRENT_VERSION <= GOEP_EP_API_VERSION,                                    \
                          #type_ ": its version is newer than GOEP_EP_API_VERSION");                         \
    GOEP_EP_STATIC_ASSERT(sizeof(type_) == GOEP_EP_VERSION_SIZE(base_, base_##_CURRENT_VERSION),             \
                          #type_ ": sizeof is not the size of its current version")

/* ... and that version n_'s last field still ends at version n_'s size. */
#define GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(type_, base_, n_)                                           \
    GOEP_EP_STATIC_ASSERT((n_) <= base_##_CURRENT_VERSION && (n_) <= GOEP_EP_API_VERSION,                   \
                          #type_ ": version " #n_ " is newer than the struct or the API");                   \
    GOEP_EP_STATIC_ASSERT(GOEP_EP_FIELD_END(type_, GOEP_EP_VERSION_LAST(base_, n_)) ==                      \
                              GOEP_EP_VERSION_SIZE(base_, n_),                                               \
                          #type_ ": the end of version " #n_ " moved")

/* Result codes. The values shared with NCCL's ncclResult_t mean the same; 64 and above are goep's. */
typedef enum {
    goepEpSuccess = 0,
    goepEpSystemError = 2,      /* MPI or the operating system failed (the message names the call) */
    goepEpInternalError = 3,    /* a fault inside the library, caught (please report it) */
    goepEpInvalidArgument = 4,  /* a bad value: NULL, a struct of the wrong size or magic, a tensor of the wrong
                                   type or shape, an expert id out of range, a destroyed group or handle */
    goepEpInvalidUsage = 5,     /* a call out of order or not offered: goepEpComplete with nothing to
                                   complete, masking on a group without enable_mask, a feature the backend
                                   does not declare, a layout or recipe other than the group's */
    goepEpRemoteError = 6,      /* another rank refused the same collective call (its input was bad): this
                                   call wrote nothing and the group stays usable */
    goepEpTimeout = 64,         /* goep: a peer did not arrive within timeout_ns: the group is unusable */
    goepEpMasked = 65,          /* goep: (enable_mask) the other ranks masked this one after it stalled; it
                                   rejoins with goepEpMaskClean, called with them */
    goepEpMismatch = 66         /* goep: the ranks' calls no longer match (a rank skipped a call, or made one
                                   or created a handle that the others did not): no result was returned, and
                                   the group is unusable on every rank */
} goepEpResult_t;

/* Element types, numbered as NCCL's ncclDataType_t. goepEpFloat8e4m3 holds the e4m3 codes of FP8
 * dispatches (goepEpDispQuant_t); goepEpFloat4x2 (two packed FP4 e2m1 values a byte, element 2i in the
 * low nibble: the number NCCL reserves for it, nccl_ep.h's ncclFloat4x2) holds the codes of forwarded
 * NVFP4 rows, [rows, hidden / 2]; goepEpFloat8e5m2 is described but not taken by any call. */
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
    goepEpBfloat16 = 9,
    goepEpFloat8e4m3 = 10,
    goepEpFloat8e5m2 = 11,
    goepEpFloat4x2 = 12
} goepEpDataType_t;

typedef enum {
    GOEP_EP_ALGO_LOW_LATENCY = 0,   /* LL: decode, up to a few hundred tokens per rank */
    GOEP_EP_ALGO_HIGH_THROUGHPUT = 1 /* HT: training and prefill, thousands of tokens per rank */
} goepEpAlgorithm_t;

/* What an HT dispatch does when a rank would receive more than max_recv_tokens_per_rank rows. */
typedef enum {
    GOEP_EP_OVERFLOW_AUTO = GOEP_EP_AUTO, /* TRAP */
    GOEP_EP_OVERFLOW_TRAP = 1,            /* the dispatch fails on every rank (goepEpInvalidArgument here,
                                             goepEpRemoteError there), before anything is written */
    GOEP_EP_OVERFLOW_DROP = 2             /* the rows that do not fit are dropped, the same on every rank: each
                                             receiving rank keeps its rows source rank by source rank, each
                                             source's in token order, up to the bound; a dropped row contributes
                                             nothing to the combine. HT groups only. */
} goepEpOverflowPolicy_t;

/* Receive layouts: LL EXPERT_MAJOR or RANK_MAJOR, HT FLAT or EXPERT_MAJOR, where the group's backend
 * declares them (goepEpBackendSupports: GOEP_EP_FEATURE_LL_RANK_MAJOR, GOEP_EP_FEATURE_HT_EXPERT_MAJOR).
 * The group's first handle sets the layout (and HT EXPERT_MAJOR's zone alignment) for the group, whose
 * buffers are laid out for it; a later handle with another is refused with goepEpInvalidUsage naming both. */
typedef enum {
    GOEP_EP_LAYOUT_UNSET = GOEP_EP_AUTO,
    /* LL: dispatch writes tokens [local_experts, nranks * max_dispatch_tokens_per_rank, hidden]; the first
     * expert_counters[l] rows of expert l are valid, grouped by source rank in rank order, each group in
     * token order. Combine takes the expert outputs in the same shape and returns
     * out[t] = sum over k of topk_weights[t][k] * (expert output of the row of (t, k)). */
    /* HT: tokens [slots, hidden] in zones, one per local expert: zone l starts at expert_offsets[l] and
     * holds one row per (token, expert l) pair, by source rank then token, then zero rows up to a
     * multiple of dispatch_output_per_expert_alignment; topk_weights [slots] (one per row, 0 on padding),
     * no topk_idx; expert_counters are the padded counts and recv_total_counter their sum. The experts
     * apply the weights; combine sums a token's rows. */
    GOEP_EP_LAYOUT_EXPERT_MAJOR = 1,
    /* LL: tokens [nranks, max_dispatch_tokens_per_rank, hidden], a token once per rank that owns one of
     * its experts: rank r's first src_rank_counters[r] rows are valid, in token order, with topk_weights
     * and topk_idx [nranks, max_dispatch_tokens_per_rank, num_topk] (0 and -1 where the expert is
     * elsewhere). The experts apply the weights; combine sums the ranks' rows (no weights). */
    GOEP_EP_LAYOUT_RANK_MAJOR = 2,
    /* HT: dispatch writes the received tokens [num_recv, hidden], grouped by source rank then token, with
     * their top-k weights [num_recv, num_topk] (zero where the expert is elsewhere) and expert ids
     * [num_recv, num_topk] (-1 where the expert is elsewhere). The experts apply the weights; combine sums
     * the rows each rank returns into out[t]. */
    GOEP_EP_LAYOUT_FLAT = 3
} goepEpLayout_t;

typedef enum { GOEP_EP_FWD_PASS = 0, GOEP_EP_BWD_PASS = 1 } goepEpPassDir_t;

/* Windows (ncclWindow_t): goep's tensors are host memory, so zero_copy ON and window-backed tensors are
 * refused. goep's own way without copies is goepEpHandleRecvTokens. */
typedef enum {
    GOEP_EP_ZERO_COPY_AUTO = GOEP_EP_AUTO, /* OFF */
    GOEP_EP_ZERO_COPY_OFF = 1,
    GOEP_EP_ZERO_COPY_ON = 2               /* refused: it needs window-backed tensors */
} goepEpZeroCopyMode_t;

/* How dispatch numbers the received expert ids (HT FLAT's and LL RANK_MAJOR's topk_idx output). */
typedef enum {
    GOEP_EP_EXPERT_ID_AUTO = GOEP_EP_AUTO, /* LOCAL */
    GOEP_EP_EXPERT_ID_LOCAL = 1,           /* 0 .. local_experts-1, -1 = elsewhere */
    GOEP_EP_EXPERT_ID_GLOBAL = 2           /* rank * local_experts + local id, -1 = elsewhere */
} goepEpExpertIdKind_t;

/* Dispatch quantisation recipes. goep lays out a group's buffers for one row format, so the recipe is a
 * group setting (goepEpGroupOptions_t.dispatch_quant, a goep extension); a dispatch's quant_recipe is NONE
 * (the group's) or the group's own, and another is refused with goepEpInvalidUsage naming both. An FP8
 * dispatch writes outputs->tokens as goepEpFloat8e4m3 codes and outputs->scales as float32, one per 128
 * elements of a row ([..., ceil(hidden / 128)], the layout's leading dimensions), in both modes and any
 * hidden (the last group of a row may be shorter).
 *
 * NCCL EP has one forwarding recipe, QUANT_FWD, whose payload is told by the tokens' datatype at each
 * dispatch. goep fixes the payload with the group (its buffers hold rows of one size, and a payload the
 * backend lacks must be refused on every rank before anything is sent), so a group names it:
 * dispatch_quant FWD forwards e4m3 codes, FWD_NVFP4 (a goep value) NVFP4 rows. A dispatch of a
 * FWD_NVFP4 group passes GOEP_EP_DISP_QUANT_FWD as NCCL EP programs do (or FWD_NVFP4, or NONE). */
typedef enum {
    GOEP_EP_DISP_QUANT_NONE = 0,
    GOEP_EP_DISP_QUANT_FWD = 1,       /* the caller's e4m3 codes (inputs->tokens [num_tokens, hidden]
                                         goepEpFloat8e4m3) and float32 scales (inputs->scales [num_tokens,
                                         ceil(hidden / 128)]) forwarded as they are; NCCL EP's other forwarded
                                         payloads (16- or 32-bit rows, 16-bit or uint8 scales, other scale
                                         counts) are refused naming them, float4x2 rows naming FWD_NVFP4 */
    GOEP_EP_DISP_QUANT_DS_FP8E3M4 = 2, /* the rows (bfloat16 or float32) cast to e4m3 with a float32 scale per 128
                                          elements, amax / 448 (round_scales: rounded up to a power of two) */
    /* goep: NCCL EP's QUANT_FWD with ncclFloat4x2 tokens, as a group's dispatch_quant (GOEP_EP_FEATURE_
     * NVFP4_FORWARD): inputs->tokens [num_tokens, hidden / 2] goepEpFloat4x2 (FP4 e2m1 codes, two a byte)
     * and inputs->scales [num_tokens, hidden / 16] goepEpUint8 or goepEpFloat8e4m3 (one e4m3 scale byte per
     * 16 elements, NCCL EP's layout for packed FP4), forwarded as they are; element i of a row is code i
     * times scale i / 16 (a per-tensor global scale, where the recipe has one, stays the caller's). hidden
     * (max_token_bytes / the token type's size) must be a multiple of 32. outputs->tokens is goepEpFloat4x2,
     * the layout's leading dimensions then hidden / 2, and outputs->scales of inputs->scales' datatype, the
     * layout's leading dimensions then hidden / 16. */
    GOEP_EP_DISP_QUANT_FWD_NVFP4 = 0x100
} goepEpDispQuant_t;

/* Combine quantisation recipes. goep's low-precision combines are a group setting
 * (goepEpGroupOptions_t.combine_quant, a goep extension): a combine's quant_recipe is NONE (the
 * group's format, whichever it is) or the group's. */
typedef enum {
    GOEP_EP_COMB_QUANT_NONE = 0,
    /* LL EXPERT_MAJOR (GOEP_EP_FEATURE_NVFP4_COMBINE): each valid expert output row travels as FP4 e2m1
     * codes with an e4m3 scale per 16 elements and a float32 row scale g = amax / 2688, amax the row's
     * largest |value| (docs/ep.md, "An NVFP4 combine", defines the cast and the sum); hidden a multiple of
     * 32. goep computes g itself: inputs->scales may be NULL, or NCCL EP's global scales, checked (see
     * goepEpCombineInputs_t). */
    GOEP_EP_COMB_QUANT_NVFP4 = 1,
    /* goep: combines (LL and HT) whose expert outputs travel as e4m3 codes with a float32 scale per 128 elements
     * (FP8), or a power-of-two scale (FP8_UE8M0), summed in float32 and rounded once to the token type
     * (docs/ep.md, "A low-precision combine", defines it and bounds its error). */
    GOEP_EP_COMB_QUANT_FP8 = 0x100,
    GOEP_EP_COMB_QUANT_FP8_UE8M0 = 0x101
} goepEpCombQuant_t;

/* A window handle (ncclWindow_t). goep has none: only NULL is accepted. */
typedef struct goepEpWindow* goepEpWindow_t;

/* A stream: the very type of CUDA's cudaStream_t, so that a program's stream passes unchanged. Accepted
 * and never dereferenced (see "Streams" above): NULL is the usual value. */
typedef struct CUstream_st* goepEpStream_t;

/* A tensor: `ndim` extents in `sizes` (row-major, the last one contiguous) of `datatype` elements at
 * `data`, in the caller's host memory. Neither the memory nor `sizes` is copied or kept (but see
 * send_only). `data` may be NULL only when the tensor has no elements, and must be aligned to its
 * element size. win_hdl must be NULL and win_offset 0 (goep has no windows). A descriptor initialised with
 * GOEP_EP_TENSOR_INIT carries GOEP_EP_TENSOR_MAGIC; one made by goepEpTensorAlloc carries
 * GOEP_EP_TENSOR_MAGIC_ALLOC. */
#define GOEP_EP_TENSOR_MAGIC 0x60E97E50u
#define GOEP_EP_TENSOR_MAGIC_ALLOC 0x60E97E51u
typedef struct goepEpTensor {
    unsigned int size;  /* sizeof(goepEpTensor_t) */
    unsigned int magic; /* GOEP_EP_TENSOR_MAGIC */
    unsigned int ndim;  /* 1..8 */
    goepEpDataType_t datatype;
    void* data;
    goepEpWindow_t win_hdl; /* NULL */
    uint64_t win_offset;    /* 0 */
    size_t* sizes;          /* ndim extents, owned by the caller; only goepEpHandleRecvTokens writes them */
} goepEpTensor_t;
#define GOEP_EP_TENSOR_INIT_INLINE .size = (unsigned int)sizeof(goepEpTensor_t), .magic = GOEP_EP_TENSOR_MAGIC
#define GOEP_EP_TENSOR_INIT ((goepEpTensor_t){GOEP_EP_TENSOR_INIT_INLINE})
#define GOEP_EP_TENSOR_SIZE ((unsigned int)sizeof(goepEpTensor_t))
#define GOEP_EP_TENSOR_V1_LAST_FIELD sizes
#define GOEP_EP_TENSOR_V1_SIZE 48u
#define GOEP_EP_TENSOR_CURRENT_VERSION 1
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpTensor_t, GOEP_EP_TENSOR);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpTensor_t, GOEP_EP_TENSOR, 1);

/* Options of goepEpTensorAlloc (none yet): NULL, or initialised with GOEP_EP_TENSOR_ALLOC_CONFIG_INIT. */
typedef struct {
    unsigned int size;
    unsigned int magic; /* GOEP_EP_MAGIC */
} goepEpTensorAllocConfig_t;
#define GOEP_EP_TENSOR_ALLOC_CONFIG_INIT GOEP_EP_STRUCT_INIT(goepEpTensorAllocConfig_t, GOEP_EP_MAGIC)
#define GOEP_EP_TENSOR_ALLOC_CONFIG_SIZE ((unsigned int)sizeof(goepEpTensorAllocConfig_t))
#define GOEP_EP_TENSOR_ALLOC_CONFIG_V1_LAST_FIELD magic
#define GOEP_EP_TENSOR_ALLOC_CONFIG_V1_SIZE 8u
#define GOEP_EP_TENSOR_ALLOC_CONFIG_CURRENT_VERSION 1
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpTensorAllocConfig_t, GOEP_EP_TENSOR_ALLOC_CONFIG);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpTensorAllocConfig_t, GOEP_EP_TENSOR_ALLOC_CONFIG, 1);

/* Allocator hooks (NCCL EP's device allocator). Their result is cudaError_t where CUDA's runtime header
 * was included first, so that a program's hooks keep their type; an int otherwise (0: success). */
#if defined(__DRIVER_TYPES_H__)
typedef cudaError_t goepEpAllocResult_t;
#else
typedef int goepEpAllocResult_t;
#endif
typedef goepEpAllocResult_t (*goepEpAllocFn_t)(void** ptr, size_t size, void* context);
typedef goepEpAllocResult_t (*goepEpFreeFn_t)(void* ptr, void* context);

/* The group config's allocator: both functions or neither (checked). goep calls neither: its group
 * buffers are MPI shared memory and windows, which no caller's allocator can provide, and a handle's
 * copy of its routing is host memory of the library's. */
typedef struct {
    goepEpAllocFn_t alloc_fn;
    goepEpFreeFn_t free_fn;
    void* context; /* passed to both, unchanged */
} goepEpAllocConfig_t;

/* A group's configuration: the same on every rank (checked). NCCL EP's version 2 layout; goep's own
 * settings are in goepEpGroupOptions_t. */
typedef struct {
    unsigned int size;    /* sizeof(goepEpGroupConfig_t) */
    unsigned int magic;   /* GOEP_EP_MAGIC */
    unsigned int version; /* GOEP_EP_API_VERSION the caller was built against (1 or 2) */
    goepEpAlgorithm_t algorithm;
    unsigned int num_experts;                  /* a multiple of the number of ranks; rank r owns experts
                                                  [r*L, (r+1)*L), L = num_experts / nranks */
    unsigned int max_dispatch_tokens_per_rank; /* > 0 */
    unsigned int max_recv_tokens_per_rank;     /* HT: bound on the rows one rank receives (AUTO: nranks *
                                                  max_dispatch_tokens_per_rank); LL: ignored */
    unsigned int max_token_bytes;              /* bytes of one token row: hidden * the token type's size
                                                  (goepEpGroupOptions_t.token_datatype: bfloat16 unless set) */
    unsigned long rdma_buffer_size;            /* accepted, no effect on the CPU: goep sizes its buffers
                                                  from the fields above (goepEpBufferPlan) */
    unsigned int num_qp_per_rank;              /* accepted, no effect on the CPU */
    unsigned int num_channels;                 /* accepted, no effect on the CPU */
    unsigned int max_num_sms;                  /* accepted, no effect on the CPU */
    goepEpAllocConfig_t alloc;                 /* both or neither; never called (see goepEpAllocConfig_t) */
    unsigned int enable_mask;                  /* LL only: a rank that stalls past timeout_ns is masked, not an
                                                  error (goepEpMaskQuery, goepEpGetAsyncError) */
    uint64_t timeout_ns;                       /* bound on every wait for a peer; AUTO: 60 s */
    /* Version 2 (read when `size` covers them). */
    goepEpZeroCopyMode_t zero_copy;            /* AUTO or OFF; ON is refused (goep has no windows) */
    goepEpOverflowPolicy_t overflow_policy;    /* HT: AUTO (TRAP), TRAP or DROP */
    unsigned int num_topk;                     /* experts per token, an upper bound on each handle's, at most
                                                  min(num_experts, 64); 0: the group's first handle's */
    unsigned char padding_v2[4];
} goepEpGroupConfig_t;
#define GOEP_EP_GROUP_CONFIG_INIT \
    ((goepEpGroupConfig_t){.size = (unsigned int)sizeof(goepEpGroupConfig_t), .magic = GOEP_EP_MAGIC, \
                           .version = GOEP_EP_API_VERSION})
#define GOEP_EP_GROUP_CONFIG_SIZE ((unsigned int)sizeof(goepEpGroupConfig_t))
#define GOEP_EP_GROUP_CONFIG_V1_LAST_FIELD timeout_ns
#define GOEP_EP_GROUP_CONFIG_V1_SIZE 96u
#define GOEP_EP_GROUP_CONFIG_V2_LAST_FIELD padding_v2
#define GOEP_EP_GROUP_CONFIG_V2_SIZE 112u
#define GOEP_EP_GROUP_CONFIG_CURRENT_VERSION 2
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpGroupConfig_t, GOEP_EP_GROUP_CONFIG);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpGroupConfig_t, GOEP_EP_GROUP_CONFIG, 1);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpGroupConfig_t, GOEP_EP_GROUP_CONFIG, 2);

/* Counters a dispatch writes (IN/OUT: the descriptors are the caller's, the counts are written into their
 * memory). Each field may be NULL. */
typedef struct {
    unsigned int size;
    unsigned int magic;
    goepEpTensor_t* expert_counters;    /* [local_experts] int32 or int64: rows received per local expert.
                                           Required by an LL EXPERT_MAJOR dispatch. */
    goepEpTensor_t* src_rank_counters;  /* LL RANK_MAJOR only: [nranks] int32 or int64, rows from each rank */
    goepEpTensor_t* expert_offsets;     /* HT EXPERT_MAJOR only: [local_experts] int32 or int64, where each
                                           expert's zone starts */
    goepEpTensor_t* recv_total_counter; /* [1] int32 or int64: rows received (HT FLAT; with
                                           GOEP_EP_OVERFLOW_DROP the rows kept; HT EXPERT_MAJOR: padding
                                           included) or their sum (LL) */
    /* Version 2. */
    goepEpExpertIdKind_t recv_topk_idx_kind;
    unsigned char padding_v2[4];
} goepEpLayoutInfo_t;
#define GOEP_EP_LAYOUT_INFO_INIT GOEP_EP_STRUCT_INIT(goepEpLayoutInfo_t, GOEP_EP_MAGIC)
#define GOEP_EP_LAYOUT_INFO_SIZE ((unsigned int)sizeof(goepEpLayoutInfo_t))
#define GOEP_EP_LAYOUT_INFO_V1_LAST_FIELD recv_total_counter
#define GOEP_EP_LAYOUT_INFO_V1_SIZE 40u
#define GOEP_EP_LAYOUT_INFO_V2_LAST_FIELD padding_v2
#define GOEP_EP_LAYOUT_INFO_V2_SIZE 48u
#define GOEP_EP_LAYOUT_INFO_CURRENT_VERSION 2
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpLayoutInfo_t, GOEP_EP_LAYOUT_INFO);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpLayoutInfo_t, GOEP_EP_LAYOUT_INFO, 1);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpLayoutInfo_t, GOEP_EP_LAYOUT_INFO, 2);

typedef struct {
    unsigned int size;
    unsigned int magic;
    goepEpTensor_t* tokens;       /* required: [num_tokens, hidden], the group's token type */
    goepEpTensor_t* topk_weights; /* [num_tokens, num_topk] float32: the gate weights. HT: required by the
                                     handle's first dispatch. LL: optional here (combine's
                                     outputs->topk_weights may give them instead). A later dispatch of the
                                     same handle without them keeps the earlier ones. */
    goepEpTensor_t* scales;       /* GOEP_EP_DISP_QUANT_FWD: [num_tokens, ceil(hidden / 128)] float32, the
                                     scales of tokens' e4m3 codes; in a FWD_NVFP4 group [num_tokens,
                                     hidden / 16] uint8 or float8e4m3, the e4m3 scales of tokens' float4x2
                                     codes; otherwise NULL */
} goepEpDispatchInputs_t;
#define GOEP_EP_DISPATCH_INPUTS_INIT GOEP_EP_STRUCT_INIT(goepEpDispatchInputs_t, GOEP_EP_MAGIC)
#define GOEP_EP_DISPATCH_INPUTS_SIZE ((unsigned int)sizeof(goepEpDispatchInputs_t))
#define GOEP_EP_DISPATCH_INPUTS_V1_LAST_FIELD scales
#define GOEP_EP_DISPATCH_INPUTS_V1_SIZE 32u
#define GOEP_EP_DISPATCH_INPUTS_CURRENT_VERSION 1
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpDispatchInputs_t, GOEP_EP_DISPATCH_INPUTS);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpDispatchInputs_t, GOEP_EP_DISPATCH_INPUTS, 1);

typedef struct {
    unsigned int size;
    unsigned int magic;
    goepEpTensor_t* tokens;       /* LL EXPERT_MAJOR: [local_experts, nranks * max_dispatch_tokens_per_rank,
                                     hidden]; only each expert's first expert_counters[l] rows are written.
                                     LL RANK_MAJOR: [nranks, max_dispatch_tokens_per_rank, hidden], rank r's
                                     first src_rank_counters[r] rows written.
                                     HT FLAT and EXPERT_MAJOR: [slots, hidden] with slots at least the rows received
                                     (max_recv_tokens_per_rank always is); only the first num_recv rows are
                                     written. NULL (a goep extension): nothing is copied; the rows stay in the
                                     group's buffer, read in place with goepEpHandleRecvTokens. */
    goepEpTensor_t* topk_weights; /* HT FLAT: [slots, num_topk] float32, optional; HT EXPERT_MAJOR: [slots];
                                     LL RANK_MAJOR: [nranks, max_dispatch_tokens_per_rank, num_topk];
                                     LL EXPERT_MAJOR: must be NULL. */
    goepEpTensor_t* scales;       /* an FP8 dispatch (dispatch_quant DS_FP8E3M4 or FWD): required, float32,
                                     the layout's leading dimensions then ceil(hidden / 128), with
                                     outputs->tokens goepEpFloat8e4m3; an NVFP4 one (FWD_NVFP4): required,
                                     inputs->scales' datatype, the leading dimensions then hidden / 16, with
                                     outputs->tokens goepEpFloat4x2 [..., hidden / 2]. outputs->tokens may
                                     then not be NULL. Otherwise NULL. */
    goepEpTensor_t* topk_idx;     /* HT FLAT: [slots, num_topk], LL RANK_MAJOR: [nranks,
                                     max_dispatch_tokens_per_rank, num_topk]; int32 or int64, optional.
                                     Otherwise NULL. */
} goepEpDispatchOutputs_t;
#define GOEP_EP_DISPATCH_OUTPUTS_INIT GOEP_EP_STRUCT_INIT(goepEpDispatchOutputs_t, GOEP_EP_MAGIC)
#define GOEP_EP_DISPATCH_OUTPUTS_SIZE ((unsigned int)sizeof(goepEpDispatchOutputs_t))
#define GOEP_EP_DISPATCH_OUTPUTS_V1_LAST_FIELD topk_idx
#define GOEP_EP_DISPATCH_OUTPUTS_V1_SIZE 40u
#define GOEP_EP_DISPATCH_OUTPUTS_CURRENT_VERSION 1
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpDispatchOutputs_t, GOEP_EP_DISPATCH_OUTPUTS);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpDispatchOutputs_t, GOEP_EP_DISPATCH_OUTPUTS, 1);

typedef struct {
    unsigned int size;
    unsigned int magic;
    goepEpTensor_t* tokens;       /* required: the expert outputs, shaped as the dispatch's outputs->tokens
                                     (HT: at least num_recv rows; the first num_recv are read) */
    goepEpTensor_t* topk_weights; /* HT only: [slots, num_topk] float32, one value per received (row, slot),
                                     summed back to each token's (t, k) into outputs->topk_weights (the
                                     gradient of the gate weights in a backward pass). */
    /* Version 2. */
    goepEpTensor_t* scales;       /* GOEP_EP_COMB_QUANT_NVFP4 groups: NULL (goep computes each row's scale), or
                                     NCCL EP's global scales, [local_experts, nranks *
                                     max_dispatch_tokens_per_rank, 1] float32: for each valid row,
                                     2688 / amax(|tokens[row, :]|), 0 where amax is 0. Each valid row's
                                     scale is checked against float32(2688 / amax) of that row (amax of the
                                     values as float32, the quotient a float32 division): it must be that
                                     float32 or one of its two neighbours (one unit in the last place, what
                                     another division or a reciprocal gives); a row with a NaN value has no
                                     scale. Any other is refused (goepEpInvalidArgument naming the row, the
                                     scale and the one wanted, on every rank), since goep's combine uses
                                     the scale of its definition, g = amax / 2688. Rows past
                                     expert_counters are not read. Otherwise NULL. */
} goepEpCombineInputs_t;
#define GOEP_EP_COMBINE_INPUTS_INIT GOEP_EP_STRUCT_INIT(goepEpCombineInputs_t, GOEP_EP_MAGIC)
#define GOEP_EP_COMBINE_INPUTS_SIZE ((unsigned int)sizeof(goepEpCombineInputs_t))
#define GOEP_EP_COMBINE_INPUTS_V1_LAST_FIELD topk_weights
#define GOEP_EP_COMBINE_INPUTS_V1_SIZE 24u
#define GOEP_EP_COMBINE_INPUTS_V2_LAST_FIELD scales
#define GOEP_EP_COMBINE_INPUTS_V2_SIZE 32u
#define GOEP_EP_COMBINE_INPUTS_CURRENT_VERSION 2
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpCombineInputs_t, GOEP_EP_COMBINE_INPUTS);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpCombineInputs_t, GOEP_EP_COMBINE_INPUTS, 1);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpCombineInputs_t, GOEP_EP_COMBINE_INPUTS, 2);

typedef struct {
    unsigned int size;
    unsigned int magic;
    goepEpTensor_t* tokens;       /* required: [num_tokens, hidden], in the handle's token order */
    goepEpTensor_t* topk_weights; /* [num_tokens, num_topk] float32. LL: the weights combine applies (all ones:
                                     an unweighted sum); NULL uses the dispatch's. HT: written with
                                     inputs->topk_weights' sums; must be given with it. */
} goepEpCombineOutputs_t;
#define GOEP_EP_COMBINE_OUTPUTS_INIT GOEP_EP_STRUCT_INIT(goepEpCombineOutputs_t, GOEP_EP_MAGIC)
#define GOEP_EP_COMBINE_OUTPUTS_SIZE ((unsigned int)sizeof(goepEpCombineOutputs_t))
#define GOEP_EP_COMBINE_OUTPUTS_V1_LAST_FIELD topk_weights
#define GOEP_EP_COMBINE_OUTPUTS_V1_SIZE 24u
#define GOEP_EP_COMBINE_OUTPUTS_CURRENT_VERSION 1
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpCombineOutputs_t, GOEP_EP_COMBINE_OUTPUTS);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpCombineOutputs_t, GOEP_EP_COMBINE_OUTPUTS, 1);

typedef struct {
    unsigned int size;
    unsigned int magic;
    size_t dispatch_output_per_expert_alignment; /* HT EXPERT_MAJOR: pads each zone to a multiple of this many
                                                    rows (a power of two; 0 or 1: none); other layouts: 0 or 1 */
} goepEpHandleConfig_t;
#define GOEP_EP_HANDLE_CONFIG_INIT GOEP_EP_STRUCT_INIT(goepEpHandleConfig_t, GOEP_EP_MAGIC)
#define GOEP_EP_HANDLE_CONFIG_SIZE ((unsigned int)sizeof(goepEpHandleConfig_t))
#define GOEP_EP_HANDLE_CONFIG_V1_LAST_FIELD dispatch_output_per_expert_alignment
#define GOEP_EP_HANDLE_CONFIG_V1_SIZE 16u
#define GOEP_EP_HANDLE_CONFIG_CURRENT_VERSION 1
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpHandleConfig_t, GOEP_EP_HANDLE_CONFIG);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpHandleConfig_t, GOEP_EP_HANDLE_CONFIG, 1);

typedef struct {
    unsigned int size;
    unsigned int magic;
    unsigned int send_only;          /* 1: send, and let goepEpComplete receive (compute may run between) */
    unsigned int round_scales;       /* 0, or the group's dispatch_round_scales */
    goepEpPassDir_t pass_direction;  /* HT BWD: a later dispatch of the handle's routing, without weights */
    /* Version 2. */
    goepEpDispQuant_t quant_recipe;  /* NONE (the group's recipe), or the group's dispatch_quant */
} goepEpDispatchConfig_t;
#define GOEP_EP_DISPATCH_CONFIG_INIT GOEP_EP_STRUCT_INIT(goepEpDispatchConfig_t, GOEP_EP_MAGIC)
#define GOEP_EP_DISPATCH_CONFIG_SIZE ((unsigned int)sizeof(goepEpDispatchConfig_t))
#define GOEP_EP_DISPATCH_CONFIG_V1_LAST_FIELD pass_direction
#define GOEP_EP_DISPATCH_CONFIG_V1_SIZE 20u
#define GOEP_EP_DISPATCH_CONFIG_V2_LAST_FIELD quant_recipe
#define GOEP_EP_DISPATCH_CONFIG_V2_SIZE 24u
#define GOEP_EP_DISPATCH_CONFIG_CURRENT_VERSION 2
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpDispatchConfig_t, GOEP_EP_DISPATCH_CONFIG);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpDispatchConfig_t, GOEP_EP_DISPATCH_CONFIG, 1);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpDispatchConfig_t, GOEP_EP_DISPATCH_CONFIG, 2);

typedef struct {
    unsigned int size;
    unsigned int magic;
    unsigned int send_only;          /* 1: send, and let goepEpComplete receive and reduce */
    goepEpPassDir_t pass_direction;  /* HT BWD requires inputs->topk_weights and outputs->topk_weights */
    /* Version 2. */
    goepEpCombQuant_t quant_recipe;  /* NONE, or the group's combine_quant (goepEpGroupOptions_t) */
} goepEpCombineConfig_t;
#define GOEP_EP_COMBINE_CONFIG_INIT GOEP_EP_STRUCT_INIT(goepEpCombineConfig_t, GOEP_EP_MAGIC)
#define GOEP_EP_COMBINE_CONFIG_SIZE ((unsigned int)sizeof(goepEpCombineConfig_t))
#define GOEP_EP_COMBINE_CONFIG_V1_LAST_FIELD pass_direction
#define GOEP_EP_COMBINE_CONFIG_V1_SIZE 16u
#define GOEP_EP_COMBINE_CONFIG_V2_LAST_FIELD quant_recipe
#define GOEP_EP_COMBINE_CONFIG_V2_SIZE 20u
#define GOEP_EP_COMBINE_CONFIG_CURRENT_VERSION 2
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpCombineConfig_t, GOEP_EP_COMBINE_CONFIG);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpCombineConfig_t, GOEP_EP_COMBINE_CONFIG, 1);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpCombineConfig_t, GOEP_EP_COMBINE_CONFIG, 2);

typedef struct goepEpCompleteConfig {
    unsigned int size;
    unsigned int magic;
} goepEpCompleteConfig_t;
#define GOEP_EP_COMPLETE_CONFIG_INIT GOEP_EP_STRUCT_INIT(goepEpCompleteConfig_t, GOEP_EP_MAGIC)
#define GOEP_EP_COMPLETE_CONFIG_SIZE ((unsigned int)sizeof(goepEpCompleteConfig_t))
#define GOEP_EP_COMPLETE_CONFIG_V1_LAST_FIELD magic
#define GOEP_EP_COMPLETE_CONFIG_V1_SIZE 8u
#define GOEP_EP_COMPLETE_CONFIG_CURRENT_VERSION 1
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpCompleteConfig_t, GOEP_EP_COMPLETE_CONFIG);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpCompleteConfig_t, GOEP_EP_COMPLETE_CONFIG, 1);

/* Opaque handles: numbers the library hands out, never dereferenced by the caller. */
typedef struct goepEpGroup* goepEpGroup_t;
typedef struct goepEpHandle* goepEpHandle_t;

/* ===================================================================================================
 * goep extensions: types with no NCCL EP counterpart.
 * =================================================================================================== */

/* goep: what goepEpRefuse stands for. */
typedef enum {
    GOEP_EP_CALL_CREATE_HANDLE = 1,
    GOEP_EP_CALL_DISPATCH = 2,
    GOEP_EP_CALL_COMBINE = 3
} goepEpCall_t;

/* goep: an optional behaviour a backend declares (goepEpBackendSupports). The values and names are those
 * of Go's ep.Feature (FeatureFP8Wire is GOEP_EP_FEATURE_FP8_WIRE), checked by the library's tests. */
typedef enum {
    GOEP_EP_FEATURE_FP8_WIRE = 1,           /* FP8 dispatch: the engine casts the rows on the way */
    GOEP_EP_FEATURE_MASK_STALLED_RANKS = 2, /* masking stalled ranks (enable_mask) */
    GOEP_EP_FEATURE_FP8_FORWARD = 3,        /* forwarding the caller's FP8 codes and scales as they are */
    GOEP_EP_FEATURE_FP8_COMBINE = 4,        /* a low-precision combine */
    GOEP_EP_FEATURE_OVERFLOW_DROP = 5,      /* HT dropping what does not fit (GOEP_EP_OVERFLOW_DROP) */
    GOEP_EP_FEATURE_REFUSALS = 6,           /* a refused call failing at once on every rank */
    GOEP_EP_FEATURE_METER = 7,              /* per-peer waits and network bytes */
    GOEP_EP_FEATURE_NAMED_TIMEOUTS = 8,     /* timeouts naming the stalled peer */
    GOEP_EP_FEATURE_ZERO_ALLOCS = 9,        /* steady-state calls without allocations */
    GOEP_EP_FEATURE_HT_EXPERT_MAJOR = 10,   /* the HT expert-major receive layout */
    GOEP_EP_FEATURE_LL_RANK_MAJOR = 11,     /* the LL rank-major receive layout */
    GOEP_EP_FEATURE_GLOBAL_EXPERT_IDS = 12, /* received top-k ids as global expert ids */
    GOEP_EP_FEATURE_CALL_SEQUENCE = 13,     /* calls checked to match across ranks */
    GOEP_EP_FEATURE_NVFP4_FORWARD = 14,     /* forwarding the caller's NVFP4 codes and scales as they are */
    GOEP_EP_FEATURE_NVFP4_COMBINE = 15      /* an NVFP4 combine (LL) */
} goepEpFeature_t;

/* goep: a group's settings that NCCL EP's config has no field for (goepEpCreateGroupWithOptions). Kept
 * apart so that goepEpGroupConfig_t stays NCCL EP's layout, whatever NCCL adds to it later. */
typedef struct {
    unsigned int size;                /* sizeof(goepEpGroupOptions_t) */
    unsigned int magic;               /* GOEP_EP_MAGIC */
    goepEpDataType_t token_datatype;  /* the tokens' element type: goepEpBfloat16 or goepEpFloat32; 0
                                         (goepEpInt8, never a token type): bfloat16, what NCCL EP programs
                                         size max_token_bytes for */
    goepEpCombQuant_t combine_quant;  /* NONE, GOEP_EP_COMB_QUANT_FP8 / FP8_UE8M0 (LL and HT groups), or NVFP4
                                         (LL EXPERT_MAJOR), where the backend declares it */
    const char* backend;              /* the ep backend that moves the rows, by its registered name ("cpu",
                                         "cpu-onesided"; `ep-bench -device list` lists them); NULL or "":
                                         "cpu". Read during the call only. */
    /* Version 2. */
    goepEpDispQuant_t dispatch_quant; /* how every dispatch of the group moves its rows: NONE (the token type),
                                         DS_FP8E3M4 (cast to e4m3 with a float32 scale per 128 elements, LL and
                                         HT, any hidden), FWD (the caller's e4m3 codes and float32 scales, per
                                         128 elements, forwarded) or FWD_NVFP4 (the caller's float4x2 codes and
                                         e4m3 scale bytes, per 16 elements, forwarded), where the backend
                                         declares it. goep lays the group's buffers out for one format, so it is
                                         a group setting: a dispatch's config.quant_recipe is NONE (the group's)
                                         or the group's own (FWD also names FWD_NVFP4, as NCCL EP's recipe) */
    unsigned int dispatch_round_scales; /* DS_FP8E3M4: 1 rounds each scale up to a power of two (UE8M0), as
                                           NCCL EP's round_scales; a dispatch's round_scales is 0 or the same */
} goepEpGroupOptions_t;
#define GOEP_EP_GROUP_OPTIONS_INIT GOEP_EP_STRUCT_INIT(goepEpGroupOptions_t, GOEP_EP_MAGIC)
#define GOEP_EP_GROUP_OPTIONS_SIZE ((unsigned int)sizeof(goepEpGroupOptions_t))
#define GOEP_EP_GROUP_OPTIONS_V1_LAST_FIELD backend
#define GOEP_EP_GROUP_OPTIONS_V1_SIZE 24u
#define GOEP_EP_GROUP_OPTIONS_V2_LAST_FIELD dispatch_round_scales
#define GOEP_EP_GROUP_OPTIONS_V2_SIZE 32u
#define GOEP_EP_GROUP_OPTIONS_CURRENT_VERSION 2
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpGroupOptions_t, GOEP_EP_GROUP_OPTIONS);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpGroupOptions_t, GOEP_EP_GROUP_OPTIONS, 1);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpGroupOptions_t, GOEP_EP_GROUP_OPTIONS, 2);

/* goep: the memory a group holds, per rank and per node (goepEpBufferPlan). */
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
#define GOEP_EP_MEM_INFO_SIZE ((unsigned int)sizeof(goepEpMemInfo_t))
#define GOEP_EP_MEM_INFO_V1_LAST_FIELD padding_v1
#define GOEP_EP_MEM_INFO_V1_SIZE 48u
#define GOEP_EP_MEM_INFO_CURRENT_VERSION 1
GOEP_EP_STATIC_ASSERT_STRUCT_ABI(goepEpMemInfo_t, GOEP_EP_MEM_INFO);
GOEP_EP_STATIC_ASSERT_STRUCT_ABI_BOUNDARY(goepEpMemInfo_t, GOEP_EP_MEM_INFO, 1);

#ifndef GOEP_EP_NO_PROTOTYPES /* the library's own build declares them from Go */

/* The library's GOEP_EP_VERSION_CODE (compare with the header's). */
goepEpResult_t goepEpGetVersion(int* version);

/* Make a descriptor of ndim extents (copied from sizes) of datatype, its sizes array in the same
 * allocation: *tensor has data NULL (set it to the caller's memory) and magic GOEP_EP_TENSOR_MAGIC_ALLOC.
 * config may be NULL. Free it with goepEpTensorDestroy; the memory it describes stays the caller's. */
goepEpResult_t goepEpTensorAlloc(goepEpTensor_t** tensor, unsigned int ndim, goepEpDataType_t datatype,
                                 const size_t* sizes, const goepEpTensorAllocConfig_t* config);

/* Free a descriptor made by goepEpTensorAlloc (not the memory it describes). NULL is accepted; any other
 * pointer (a descriptor of the caller's, one already freed) is refused with goepEpInvalidArgument, never
 * read or freed. */
goepEpResult_t goepEpTensorDestroy(goepEpTensor_t* tensor);

/* Create a group over the ranks of comm (collective over them, with the same config on every rank), with
 * goep's default options (goepEpCreateGroupWithOptions). It checks the config and duplicates comm; the
 * group's buffers are allocated by its first goepEpInitHandle or goepEpCreateHandle, which is collective:
 * every rank's first handle must have the same top-k (config.num_topk when set, else the handle's) and
 * layout, or that call fails on every rank naming the ranks that differ. A later handle's top-k may be
 * smaller (LL groups: padded with -1), never larger (goepEpInvalidUsage: create the group with that
 * config.num_topk). comm stays the caller's: the group works on a duplicate of it and the caller may
 * free comm once goepEpCreateGroup returns. MPI must be initialised;
 * goep never initialises or finalises it. A rank that does not call within timeout_ns is named in the
 * others' goepEpTimeout. */
goepEpResult_t goepEpCreateGroup(goepEpGroup_t* group, MPI_Comm comm, const goepEpGroupConfig_t* config);

/* Release a group and its buffers (collective). Its handles become invalid. If a rank does not call it
 * within timeout_ns, it returns goepEpTimeout naming that rank, frees nothing, and may be called again. */
goepEpResult_t goepEpGroupDestroy(goepEpGroup_t group);

/* The host bytes a handle of this layout and top-k holds at most (its copy of the routing): what
 * goepEpInitHandle's handle_mem needs. num_topk is the handle's (0 or -1: the group's); before the
 * group's first handle, with config.num_topk 0, it must be given. */
goepEpResult_t goepEpHandleMemSize(goepEpGroup_t group, goepEpLayout_t layout, const goepEpHandleConfig_t* config,
                                   size_t* size_out, int num_topk);

/* Make a handle of `layout` without routing: goepEpUpdateHandle gives it each step's. num_topk is the
 * handle's top-k, or 0 or -1 (the group's); the group's first handle opens it (collective, see
 * goepEpCreateGroup). handle_mem, if not NULL, is a 1-D uint8 tensor of at
 * least goepEpHandleMemSize bytes, 4-byte aligned, that holds the handle's copy of its routing instead of
 * memory of the library's: the caller keeps it valid until goepEpHandleDestroy. Local and not numbered
 * (no step yet). config may be NULL. */
goepEpResult_t goepEpInitHandle(goepEpHandle_t* handle, goepEpGroup_t group, goepEpLayout_t layout,
                                const goepEpHandleConfig_t* config, int num_topk, const goepEpTensor_t* handle_mem);

/* Give the handle the next step's routing: topk_idx is [num_tokens, num_topk] int32 or int64 expert ids
 * (-1 = none), copied and checked (ids in range, none repeated in a token, num_tokens at most
 * max_dispatch_tokens_per_rank). The handle's next dispatch routes by it; what an earlier dispatch of the
 * handle received is released. Refused with goepEpInvalidUsage while the handle's send-only call waits for
 * goepEpComplete or its LL dispatch has not been combined (combine it first). Local, but numbered as
 * goepEpCreateHandle: every rank updates in the same order, and a refused update (of any kind) makes the
 * dispatch of its step fail on every rank, the others' with goepEpRemoteError naming this rank and why,
 * this rank taking part in it at its next goepEpUpdateHandle, goepEpCreateHandle, goepEpDispatch or
 * goepEpGroupDestroy; the handle is then not dispatched until an update succeeds. layout_info must be
 * NULL. */
goepEpResult_t goepEpUpdateHandle(goepEpHandle_t handle, const goepEpTensor_t* topk_idx,
                                  const goepEpLayoutInfo_t* layout_info, goepEpStream_t stream);

/* goepEpInitHandle and goepEpUpdateHandle in one call (a handle per step): local (the group's first
 * handle opens it, collectively: see goepEpCreateGroup), numbered. A refused one
 * makes no handle, and the dispatch it stood for fails on every rank, as a refused update's. layout_info
 * must be NULL (goep writes the counters at dispatch); config may be NULL. */
goepEpResult_t goepEpCreateHandle(goepEpHandle_t* handle, goepEpGroup_t group, goepEpLayout_t layout,
                                  const goepEpTensor_t* topk_idx, const goepEpLayoutInfo_t* layout_info,
                                  const goepEpHandleConfig_t* config, goepEpStream_t stream);

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
                              const goepEpDispatchConfig_t* config, goepEpStream_t stream);

/* Bring the expert outputs back to each token's rank and reduce them into outputs->tokens (collective).
 * With config->send_only, goepEpComplete receives and reduces. config may be NULL. */
goepEpResult_t goepEpCombine(goepEpHandle_t handle, const goepEpCombineInputs_t* inputs,
                             const goepEpCombineOutputs_t* outputs, const goepEpCombineConfig_t* config,
                             goepEpStream_t stream);

/* Finish the handle's send-only dispatch or combine (collective, as the call it finishes). With nothing
 * to finish it does nothing and succeeds. config may be NULL. */
goepEpResult_t goepEpComplete(goepEpHandle_t handle, const goepEpCompleteConfig_t* config, goepEpStream_t stream);

/* Masking (groups with enable_mask). mask_status and mask are int[nranks] in host memory, 1 = active,
 * 0 = masked. MaskQuery is local. MaskUpdate makes `mask` the mask: collective over the ranks it leaves
 * active, which pass the same mask. MaskClean makes every rank active again: collective over every rank,
 * a masked one that came back included. Neither clears the async error flag. */
goepEpResult_t goepEpMaskQuery(goepEpGroup_t group, int* mask_status, goepEpStream_t stream);
goepEpResult_t goepEpMaskUpdate(goepEpGroup_t group, const int* mask, goepEpStream_t stream);
goepEpResult_t goepEpMaskClean(goepEpGroup_t group, goepEpStream_t stream);

/* The async error flag (groups with enable_mask): *error_out = 1 once a call has masked a rank that
 * stalled, until goepEpErrorClear. Local. */
goepEpResult_t goepEpGetAsyncError(goepEpGroup_t group, int* error_out);
goepEpResult_t goepEpErrorClear(goepEpGroup_t group);

/* ===================================================================================================
 * goep extensions: functions with no NCCL EP counterpart.
 * =================================================================================================== */

/* goep: a short name for a result code ("goepEpInvalidArgument: ..."); never NULL. */
const char* goepEpGetErrorString(goepEpResult_t result);

/* goep: the message of the last failed call on this thread ("" if none): valid until this thread's next
 * failed call. Successful calls leave it as it was. */
const char* goepEpGetLastError(void);

/* goep: goepEpCreateGroup with goep's own settings; options NULL is goepEpCreateGroup. The options must be
 * the same on every rank (checked). */
goepEpResult_t goepEpCreateGroupWithOptions(goepEpGroup_t* group, MPI_Comm comm, const goepEpGroupConfig_t* config,
                                            const goepEpGroupOptions_t* options);

/* goep: the memory a group of `config` would hold over nranks ranks on nnodes nodes (nodes as equal as
 * can be), computed without allocating anything or calling MPI. Not collective. With config.num_topk 0,
 * for the largest top-k a handle can have, min(num_experts, 64). goepEpBufferPlan is
 * goepEpBufferPlanWithOptions with options NULL. */
goepEpResult_t goepEpBufferPlan(const goepEpGroupConfig_t* config, int nranks, int nnodes, goepEpMemInfo_t* info);
goepEpResult_t goepEpBufferPlanWithOptions(const goepEpGroupConfig_t* config, const goepEpGroupOptions_t* options,
                                           int nranks, int nnodes, goepEpMemInfo_t* info);

/* goep: the bytes of buffers the group holds on this rank. Not collective. */
goepEpResult_t goepEpGroupBufferBytes(goepEpGroup_t group, size_t* bytes);

/* goep: describe in *tokens the rows the handle's latest dispatch received, where they are, in the group's
 * receive buffer: no copy, as a Go program reads them. tokens must be initialised (GOEP_EP_TENSOR_INIT)
 * with sizes pointing at 3 size_t of the caller's; the call sets ndim, datatype, data and sizes: LL
 * [local_experts, nranks * max_dispatch_tokens_per_rank, hidden] (the first expert_counters[l] rows of
 * expert l valid), HT [num_recv, hidden]. The rows may be read and overwritten in place (an expert's
 * outputs), and passed as the combine's inputs->tokens, which then reads them without a copy. They stay
 * there until the group's next dispatch (HT) or the one after (LL); a later call refuses a handle whose
 * rows are gone. The library owns the memory: never free it. Offered on the CPU engine's backends ("cpu",
 * "cpu-onesided"), whose receive buffers are MPI shared memory, in groups whose rows travel in the token
 * type (a quantised dispatch's codes and scales are written to outputs->tokens and outputs->scales). */
goepEpResult_t goepEpHandleRecvTokens(goepEpHandle_t handle, goepEpTensor_t* tokens);

/* goep: take part in a call as a refusal with `reason`, for a layer above this library that checks its
 * callers' arguments itself (the Python package does, for arrays it cannot describe): the other ranks'
 * same call fails with goepEpRemoteError naming this rank and reason, and the ranks' calls stay matched,
 * as when the library refuses an argument itself. call is GOEP_EP_CALL_DISPATCH or GOEP_EP_CALL_COMBINE
 * of `handle` (collective, as the call; a destroyed handle of a live group is accepted), or
 * GOEP_EP_CALL_CREATE_HANDLE on `group` (local, as a refused goepEpCreateHandle: the dispatch the handle
 * stood for fails on every rank). The other argument may be NULL. Returns goepEpInvalidArgument with reason
 * as the last error, or the error that kept the call from being refused (a group found unusable: its code). */
goepEpResult_t goepEpRefuse(goepEpGroup_t group, goepEpHandle_t handle, goepEpCall_t call, const char* reason);

/* goep: the backends this library can run a group on (goepEpGroupOptions_t.backend): *count of them,
 * and the name of the i-th (0 <= i < count, sorted by name) copied with its terminating NUL into buf of
 * len bytes; a buf too short is goepEpInvalidArgument naming the length needed. Not collective. */
goepEpResult_t goepEpBackendCount(int* count);
goepEpResult_t goepEpBackendName(int i, char* buf, size_t len);

/* goep: *supported = 1 if the backend named `backend` (a name or an alias) declares `feature`, else 0;
 * an unknown backend or feature is goepEpInvalidArgument naming it. Not collective. */
goepEpResult_t goepEpBackendSupports(const char* backend, goepEpFeature_t feature, int* supported);

/* goep: for bindings (the Python package checks its struct layouts with it): sizeof the named struct type
 * as the library was built ("goepEpTensor_t", ...), 0 for a name it does not know. */
size_t goepEpStructSize(const char* type_name);

#endif /* GOEP_EP_NO_PROTOTYPES */

#ifdef __cplusplus
}
#endif
#endif /* GOEP_EP_H */
