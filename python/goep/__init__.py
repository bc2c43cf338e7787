"""goep: expert-parallel dispatch and combine for Mixture-of-Experts over MPI.

The Python interface is :mod:`goep.ep`, shaped after NCCL EP's ``nccl.ep``;
:mod:`goep.core` has what programs for it take from ``nccl.core`` (element
types, unique ids, a communicator, over MPI).
"""
