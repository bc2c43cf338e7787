/*
 * abi.c: goep_ep.h's structs have NCCL EP's binary layout (nccl_ep.h, API version 2), field by field,
 * so that a program built against NCCL EP's header, renamed, passes the same bytes; its enums have
 * NCCL's values; and the library was built with the same sizes (goepEpStructSize).
 *
 * The offsets below are NCCL EP's on an LP64 host (Linux x86-64 and aarch64), written out here as
 * numbers rather than computed from any header. Most checks are at compile time; the program then
 * compares the library's sizes and prints one line.
 *
 *   bin/capi/abi
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "goep_ep.h"

#define AT(type_, field_, off_) \
    GOEP_EP_STATIC_ASSERT(offsetof(type_, field_) == (off_), #type_ "." #field_ " is not at byte " #off_)
#define SIZE(type_, n_) GOEP_EP_STATIC_ASSERT(sizeof(type_) == (n_), "sizeof(" #type_ ") is not " #n_)
#define EQ(a_, b_) GOEP_EP_STATIC_ASSERT((a_) == (b_), #a_ " is not " #b_)

GOEP_EP_STATIC_ASSERT(sizeof(void*) == 8 && sizeof(size_t) == 8 && sizeof(unsigned long) == 8, "an LP64 host");

/* ncclEpTensor_t: 48 bytes. */
AT(goepEpTensor_t, size, 0);
AT(goepEpTensor_t, magic, 4);
AT(goepEpTensor_t, ndim, 8);
AT(goepEpTensor_t, datatype, 12);
AT(goepEpTensor_t, data, 16);
AT(goepEpTensor_t, win_hdl, 24);
AT(goepEpTensor_t, win_offset, 32);
AT(goepEpTensor_t, sizes, 40);
SIZE(goepEpTensor_t, 48);
EQ(GOEP_EP_TENSOR_V1_SIZE, 48);
EQ(GOEP_EP_TENSOR_SIZE, 48);

SIZE(goepEpTensorAllocConfig_t, 8);
EQ(GOEP_EP_TENSOR_ALLOC_CONFIG_V1_SIZE, 8);

/* ncclEpAllocConfig_t, embedded in the group config. */
AT(goepEpAllocConfig_t, alloc_fn, 0);
AT(goepEpAllocConfig_t, free_fn, 8);
AT(goepEpAllocConfig_t, context, 16);
SIZE(goepEpAllocConfig_t, 24);

/* ncclEpGroupConfig_t: version 1 ends after timeout_ns (96 bytes), version 2 after padding_v2 (112). */
AT(goepEpGroupConfig_t, size, 0);
AT(goepEpGroupConfig_t, magic, 4);
AT(goepEpGroupConfig_t, version, 8);
AT(goepEpGroupConfig_t, algorithm, 12);
AT(goepEpGroupConfig_t, num_experts, 16);
AT(goepEpGroupConfig_t, max_dispatch_tokens_per_rank, 20);
AT(goepEpGroupConfig_t, max_recv_tokens_per_rank, 24);
AT(goepEpGroupConfig_t, max_token_bytes, 28);
AT(goepEpGroupConfig_t, rdma_buffer_size, 32);
AT(goepEpGroupConfig_t, num_qp_per_rank, 40);
AT(goepEpGroupConfig_t, num_channels, 44);
AT(goepEpGroupConfig_t, max_num_sms, 48);
AT(goepEpGroupConfig_t, alloc, 56);
AT(goepEpGroupConfig_t, alloc.alloc_fn, 56);
AT(goepEpGroupConfig_t, alloc.free_fn, 64);
AT(goepEpGroupConfig_t, alloc.context, 72);
AT(goepEpGroupConfig_t, enable_mask, 80);
AT(goepEpGroupConfig_t, timeout_ns, 88);
AT(goepEpGroupConfig_t, zero_copy, 96);
AT(goepEpGroupConfig_t, overflow_policy, 100);
AT(goepEpGroupConfig_t, num_topk, 104);
AT(goepEpGroupConfig_t, padding_v2, 108);
SIZE(goepEpGroupConfig_t, 112);
EQ(GOEP_EP_GROUP_CONFIG_V1_SIZE, 96);
EQ(GOEP_EP_GROUP_CONFIG_V2_SIZE, 112);
EQ(GOEP_EP_FIELD_END(goepEpGroupConfig_t, timeout_ns), 96);
EQ(GOEP_EP_API_VERSION, 2);

/* ncclEpLayoutInfo_t: 40 bytes in version 1, 48 in version 2. */
AT(goepEpLayoutInfo_t, expert_counters, 8);
AT(goepEpLayoutInfo_t, src_rank_counters, 16);
AT(goepEpLayoutInfo_t, expert_offsets, 24);
AT(goepEpLayoutInfo_t, recv_total_counter, 32);
AT(goepEpLayoutInfo_t, recv_topk_idx_kind, 40);
AT(goepEpLayoutInfo_t, padding_v2, 44);
SIZE(goepEpLayoutInfo_t, 48);
EQ(GOEP_EP_LAYOUT_INFO_V1_SIZE, 40);
EQ(GOEP_EP_LAYOUT_INFO_V2_SIZE, 48);

AT(goepEpDispatchInputs_t, tokens, 8);
AT(goepEpDispatchInputs_t, topk_weights, 16);
AT(goepEpDispatchInputs_t, scales, 24);
SIZE(goepEpDispatchInputs_t, 32);

AT(goepEpDispatchOutputs_t, tokens, 8);
AT(goepEpDispatchOutputs_t, topk_weights, 16);
AT(goepEpDispatchOutputs_t, scales, 24);
AT(goepEpDispatchOutputs_t, topk_idx, 32);
SIZE(goepEpDispatchOutputs_t, 40);

/* ncclEpCombineInputs_t: scales came with version 2. */
AT(goepEpCombineInputs_t, tokens, 8);
AT(goepEpCombineInputs_t, topk_weights, 16);
AT(goepEpCombineInputs_t, scales, 24);
SIZE(goepEpCombineInputs_t, 32);
EQ(GOEP_EP_COMBINE_INPUTS_V1_SIZE, 24);
EQ(GOEP_EP_COMBINE_INPUTS_V2_SIZE, 32);

AT(goepEpCombineOutputs_t, tokens, 8);
AT(goepEpCombineOutputs_t, topk_weights, 16);
SIZE(goepEpCombineOutputs_t, 24);

AT(goepEpHandleConfig_t, dispatch_output_per_expert_alignment, 8);
SIZE(goepEpHandleConfig_t, 16);

/* The dispatch and combine configs: quant_recipe came with version 2. */
AT(goepEpDispatchConfig_t, send_only, 8);
AT(goepEpDispatchConfig_t, round_scales, 12);
AT(goepEpDispatchConfig_t, pass_direction, 16);
AT(goepEpDispatchConfig_t, quant_recipe, 20);
SIZE(goepEpDispatchConfig_t, 24);
EQ(GOEP_EP_DISPATCH_CONFIG_V1_SIZE, 20);
AT(goepEpCombineConfig_t, send_only, 8);
AT(goepEpCombineConfig_t, pass_direction, 12);
AT(goepEpCombineConfig_t, quant_recipe, 16);
SIZE(goepEpCombineConfig_t, 20);
EQ(GOEP_EP_COMBINE_CONFIG_V1_SIZE, 16);

SIZE(goepEpCompleteConfig_t, 8);

/* Enum values: NCCL EP's (ep_enums.h, nccl_ep.h) and nccl.h's data types. */
EQ(GOEP_EP_AUTO, 0);
EQ(GOEP_EP_ALGO_LOW_LATENCY, 0);
EQ(GOEP_EP_ALGO_HIGH_THROUGHPUT, 1);
EQ(GOEP_EP_OVERFLOW_AUTO, 0);
EQ(GOEP_EP_OVERFLOW_TRAP, 1);
EQ(GOEP_EP_OVERFLOW_DROP, 2);
EQ(GOEP_EP_LAYOUT_UNSET, 0);
EQ(GOEP_EP_LAYOUT_EXPERT_MAJOR, 1);
EQ(GOEP_EP_LAYOUT_RANK_MAJOR, 2);
EQ(GOEP_EP_LAYOUT_FLAT, 3);
EQ(GOEP_EP_FWD_PASS, 0);
EQ(GOEP_EP_BWD_PASS, 1);
EQ(GOEP_EP_ZERO_COPY_AUTO, 0);
EQ(GOEP_EP_ZERO_COPY_OFF, 1);
EQ(GOEP_EP_ZERO_COPY_ON, 2);
EQ(GOEP_EP_EXPERT_ID_AUTO, 0);
EQ(GOEP_EP_EXPERT_ID_LOCAL, 1);
EQ(GOEP_EP_EXPERT_ID_GLOBAL, 2);
EQ(GOEP_EP_DISP_QUANT_NONE, 0);
EQ(GOEP_EP_DISP_QUANT_FWD, 1);
EQ(GOEP_EP_DISP_QUANT_DS_FP8E3M4, 2);
EQ(GOEP_EP_COMB_QUANT_NONE, 0);
EQ(GOEP_EP_COMB_QUANT_NVFP4, 1);
EQ(goepEpInt8, 0);
EQ(goepEpUint8, 1);
EQ(goepEpInt32, 2);
EQ(goepEpUint32, 3);
EQ(goepEpInt64, 4);
EQ(goepEpUint64, 5);
EQ(goepEpFloat16, 6);
EQ(goepEpFloat32, 7);
EQ(goepEpFloat64, 8);
EQ(goepEpBfloat16, 9);
EQ(goepEpFloat8e4m3, 10);
EQ(goepEpFloat8e5m2, 11);
EQ(goepEpFloat4x2, 12);
EQ(goepEpSuccess, 0);
EQ(goepEpSystemError, 2);
EQ(goepEpInternalError, 3);
EQ(goepEpInvalidArgument, 4);
EQ(goepEpInvalidUsage, 5);
EQ(goepEpRemoteError, 6);

int main(void) {
    /* HAS_FIELD at run time: a version-1 group config does not hold num_topk; a version-2 one does. */
    goepEpGroupConfig_t c = GOEP_EP_GROUP_CONFIG_INIT;
    int bad = 0;
    if (!GOEP_EP_HAS_FIELD(&c, goepEpGroupConfig_t, num_topk) || c.version != 2) bad++, fprintf(stderr, "abi: GOEP_EP_GROUP_CONFIG_INIT\n");
    c.size = GOEP_EP_GROUP_CONFIG_V1_SIZE;
    if (GOEP_EP_HAS_FIELD(&c, goepEpGroupConfig_t, num_topk) || !GOEP_EP_HAS_FIELD(&c, goepEpGroupConfig_t, timeout_ns))
        bad++, fprintf(stderr, "abi: GOEP_EP_HAS_FIELD on a version-1 group config\n");
    static const struct {
        const char* name;
        size_t size;
    } structs[] = {
        {"goepEpTensor_t", sizeof(goepEpTensor_t)},
        {"goepEpTensorAllocConfig_t", sizeof(goepEpTensorAllocConfig_t)},
        {"goepEpAllocConfig_t", sizeof(goepEpAllocConfig_t)},
        {"goepEpGroupConfig_t", sizeof(goepEpGroupConfig_t)},
        {"goepEpGroupOptions_t", sizeof(goepEpGroupOptions_t)},
        {"goepEpLayoutInfo_t", sizeof(goepEpLayoutInfo_t)},
        {"goepEpDispatchInputs_t", sizeof(goepEpDispatchInputs_t)},
        {"goepEpDispatchOutputs_t", sizeof(goepEpDispatchOutputs_t)},
        {"goepEpCombineInputs_t", sizeof(goepEpCombineInputs_t)},
        {"goepEpCombineOutputs_t", sizeof(goepEpCombineOutputs_t)},
        {"goepEpHandleConfig_t", sizeof(goepEpHandleConfig_t)},
        {"goepEpDispatchConfig_t", sizeof(goepEpDispatchConfig_t)},
        {"goepEpCombineConfig_t", sizeof(goepEpCombineConfig_t)},
        {"goepEpCompleteConfig_t", sizeof(goepEpCompleteConfig_t)},
        {"goepEpMemInfo_t", sizeof(goepEpMemInfo_t)},
    };
    size_t n = sizeof structs / sizeof structs[0];
    for (size_t i = 0; i < n; i++) {
        size_t lib = goepEpStructSize(structs[i].name);
        if (lib != structs[i].size) bad++, fprintf(stderr, "abi: %s is %zu bytes in the library, %zu in the header\n", structs[i].name, lib, structs[i].size);
    }
    printf("abi: NCCL EP's layouts and values; %zu struct sizes match the library: %s\n", n, bad ? "FAILED" : "ok");
    return bad ? 1 : 0;
}
