//go:build mpi

// The calling thread's last error message, the names of the result codes,
// and the struct sizes bindings check: the parts of the C interface that
// need no Go. The Go side sets the message with goep_ep_set_last_error from
// the thread that called the failing function (a call from C into Go runs
// on the calling thread), so each thread reads its own.
#include <stdlib.h>
#include <string.h>

#include "goep_ep.h"

void goep_ep_set_last_error(const char *msg, size_t n);

// A pointer per thread, not the buffer: a library loaded by dlopen (ctypes)
// gets its thread-local storage from a small static reserve, and the
// general-dynamic model asks nothing of it.
enum { LAST_ERROR_CAP = 4096 };
static __thread char *last_error __attribute__((tls_model("global-dynamic")));

void goep_ep_set_last_error(const char *msg, size_t n) {
  if (last_error == NULL && (last_error = malloc(LAST_ERROR_CAP)) == NULL) return;
  if (n >= LAST_ERROR_CAP) n = LAST_ERROR_CAP - 1;
  memcpy(last_error, msg, n);
  last_error[n] = 0;
}

const char *goepEpGetLastError(void) { return last_error ? last_error : ""; }

const char *goepEpGetErrorString(goepEpResult_t r) {
  switch (r) {
    case goepEpSuccess: return "goepEpSuccess: no error";
    case goepEpSystemError: return "goepEpSystemError: MPI or the operating system failed";
    case goepEpInternalError: return "goepEpInternalError: a fault inside the library";
    case goepEpInvalidArgument: return "goepEpInvalidArgument: a bad argument";
    case goepEpInvalidUsage: return "goepEpInvalidUsage: a call out of order or not offered";
    case goepEpRemoteError: return "goepEpRemoteError: another rank refused the call";
    case goepEpTimeout: return "goepEpTimeout: a peer did not arrive within the timeout";
    case goepEpMasked: return "goepEpMasked: the other ranks masked this rank";
    case goepEpMismatch: return "goepEpMismatch: the ranks' calls no longer match";
  }
  return "unknown goepEpResult_t";
}

size_t goepEpStructSize(const char *name) {
  static const struct {
    const char *name;
    size_t size;
  } sizes[] = {
      {"goepEpTensor_t", sizeof(goepEpTensor_t)},
      {"goepEpGroupConfig_t", sizeof(goepEpGroupConfig_t)},
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
      {"goepEpGroupOptions_t", sizeof(goepEpGroupOptions_t)},
      {"goepEpTensorAllocConfig_t", sizeof(goepEpTensorAllocConfig_t)},
      {"goepEpAllocConfig_t", sizeof(goepEpAllocConfig_t)},
  };
  if (name == NULL) return 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (strcmp(name, sizes[i].name) == 0) return sizes[i].size;
  return 0;
}
