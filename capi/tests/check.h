/*
 * check.h: the checks the C tests share. A test that includes it defines, before it, the rank it
 * runs as and its counts: static int my_rank, failures, checks. FAIL reports a failed check on
 * stderr, naming the rank and the line; EXPECT checks a condition; EXPECT_RC checks that a call
 * returns want and, when want is an error, that the last error message says substr. Each test
 * defines its own OK (ep_features.c aborts the job on a failed call, the others go on).
 */
#ifndef GOEP_CAPI_TESTS_CHECK_H
#define GOEP_CAPI_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

#include "goep_ep.h"

#define FAIL(...)                                                         \
    do {                                                                  \
        failures++;                                                       \
        fprintf(stderr, "rank %d: %s:%d: ", my_rank, __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                                     \
        fprintf(stderr, "\n");                                            \
    } while (0)

#define EXPECT(cond, ...)               \
    do {                                \
        checks++;                       \
        if (!(cond)) FAIL(__VA_ARGS__); \
    } while (0)

#define EXPECT_RC(call, want, substr)                                                                 \
    do {                                                                                              \
        checks++;                                                                                     \
        goepEpResult_t got_ = (call);                                                                 \
        if (got_ != (want))                                                                           \
            FAIL("%s returned %s, want %s (last error: %s)", #call, goepEpGetErrorString(got_),        \
                 goepEpGetErrorString(want), goepEpGetLastError());                                    \
        else if ((want) != goepEpSuccess && !strstr(goepEpGetLastError(), (substr)))                  \
            FAIL("%s: the message \"%s\" does not say \"%s\"", #call, goepEpGetLastError(), (substr)); \
    } while (0)

/* tensor describes ndim dimensions of sizes dims over data, of type d. */
static inline goepEpTensor_t tensor(goepEpDataType_t d, void* data, unsigned ndim, size_t* dims) {
    goepEpTensor_t t = GOEP_EP_TENSOR_INIT;
    t.datatype = d, t.data = data, t.ndim = ndim, t.sizes = dims;
    return t;
}

#endif
