"""goep: expert-parallel dispatch and combine for Mixture-of-Experts over MPI.

The Python interface is :mod:`goep.ep`, shaped after NCCL EP's ``nccl.ep``.
"""
