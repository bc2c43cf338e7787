"""A rank that raises an exception nothing catches ends the whole job, with the
default settings: goep.ep's excepthook aborts the MPI job after the
traceback. Without it the rank's exit would wait in MPI_Finalize while the
others wait for it in their dispatch until the group's timeout (60 s).

    mpirun -np 2 python3 python/tests/dead_rank.py     (scripts/capi/test-capi.sh checks that it ends
                                                        early, failing, with the hook's message)
"""

import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import ep_reference as ref  # noqa: E402
import goep.ep as nccl_ep  # noqa: E402

comm = MPI.COMM_WORLD
me, R = comm.Get_rank(), comm.Get_size()
s = ref.Shape(nranks=R, num_experts=4 * R, topk=2, hidden=16, max_tokens=6)
group = nccl_ep.Group.create(comm, nccl_ep.GroupConfig(
    algorithm=nccl_ep.Algorithm.LOW_LATENCY, num_experts=s.num_experts, max_dispatch_tokens_per_rank=s.max_tokens,
    max_token_bytes=s.hidden * 2, num_topk=s.topk))  # the default timeout
T = s.tokens_of(me)
for step in range(2):
    if step == 1 and me == R - 1:
        raise RuntimeError(f"rank {me} fails in its step {step}, and nothing catches it")
    handle = group.create_handle(nccl_ep.Layout.EXPERT_MAJOR, ref.experts(s, me))
    recv = np.zeros((s.local_experts, R * s.max_tokens, s.hidden), dtype=np.uint16)
    counts = np.zeros(s.local_experts, dtype=np.int32)
    handle.dispatch(nccl_ep.DispatchInputs(tokens=ref.to_bf16(ref.values(me, T, s.hidden)),
                                           topk_weights=ref.weights(T, s.topk)),
                    nccl_ep.DispatchOutputs(tokens=recv), layout_info=nccl_ep.LayoutInfo(expert_counters=counts))
    out = np.zeros((T, s.hidden), dtype=np.uint16)
    handle.combine(nccl_ep.CombineInputs(tokens=recv), nccl_ep.CombineOutputs(tokens=out))
    np.testing.assert_array_equal(ref.from_bf16(out), ref.combined(s, me))
    handle.destroy()
print(f"rank {me}: every step done", flush=True)  # never: the job ends at the failing rank
