// Flags between ranks. A flag is a 64-bit word in shared (or RMA window)
// memory holding the sequence number of the last operation its writer
// finished. The writer stores the data first, then the flag with release
// order (ep_signal); the reader waits with acquire loads (ep_wait_all) and
// only then reads the data, so it sees every byte written before the flag.
//
// ep_wait_all returns 0 once every flag holds at least target. Between sweeps
// it yields the core (a machine may run more ranks than cores), and after
// 5 ms it sleeps 50 us between sweeps. After timeout_ns (> 0) it returns the
// index of the first flag still short of target (-1 when all arrived).
#include "kernels.h"
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

void ep_signal(uint64_t *const *flags, int n, uint64_t value) {
  for (int i = 0; i < n; i++) atomic_store_explicit((_Atomic uint64_t *)flags[i], value, memory_order_release);
}

uint64_t ep_load(const uint64_t *flag) {
  return atomic_load_explicit((_Atomic const uint64_t *)flag, memory_order_acquire);
}

void ep_fence(void) { atomic_thread_fence(memory_order_seq_cst); }

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int ep_wait_all(const uint64_t *const *flags, int n, uint64_t target, int64_t timeout_ns) {
  int first = 0;  // flags before it have arrived
  int64_t start = 0;
  for (unsigned long sweep = 0;; sweep++) {
    while (first < n && atomic_load_explicit((_Atomic const uint64_t *)flags[first], memory_order_acquire) >= target)
      first++;
    if (first == n) return -1;
    if (sweep == 0) start = now_ns();
    if ((sweep & 15) == 0) {
      int64_t waited = now_ns() - start;
      if (timeout_ns > 0 && waited > timeout_ns) return first;
      if (waited > 5000000) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
        continue;
      }
    }
    sched_yield();
  }
}
