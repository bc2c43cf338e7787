"""Tests of goep.ep, run on every rank under mpirun (make test-capi):

    mpirun -np 4 python3 -m pytest -q -p no:cacheprovider python/tests

Every rank runs the same tests in the same order (they make collective
calls). Tests marked multirank need 2 or more ranks: deselect them with
-m "not multirank" at 1 rank.
"""

import os
import sys

import pytest
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def pytest_configure(config):
    config.addinivalue_line("markers", "multirank: needs 2 or more ranks (a peer to stall)")


@pytest.fixture
def comm():
    """The world; every rank meets here after each test, so that one test's
    timing never spills into the next."""
    yield MPI.COMM_WORLD
    MPI.COMM_WORLD.Barrier()
