// emulate.h: the CPU emulator of the kernels (emulate.c).
#ifndef GOEP_KERNELS_EMULATE_H
#define GOEP_KERNELS_EMULATE_H
#include <stdint.h>

// goep_emulate runs kernel number `kernel` (its place in kernels.List) over
// grid x block threads in a shuffled order; 0 on success.
int goep_emulate(int kernel, unsigned grid, unsigned block, const uint64_t *args, uint64_t seed);
#endif
