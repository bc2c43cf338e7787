"""goep.core: what a program written for NCCL EP takes from ``nccl.core``,
over MPI, so that it ports by changing its imports (``import goep.core as
nccl_core``): the element types (``NcclDataType`` and the constants
``INT8`` ... ``BFLOAT16``), ``NcclInvalid``, ``UniqueId`` and
``get_unique_id()``, and a ``Communicator`` that ``goep.ep.Group.create``
takes::

    unique_id = nccl_core.get_unique_id() if rank == 0 else None
    unique_id = MPI.COMM_WORLD.bcast(unique_id, root=0)
    comm = nccl_core.Communicator.init(nranks=nranks, rank=rank, unique_id=unique_id)
    group = nccl_ep.Group.create(comm, config)
    ...
    group.destroy(); comm.destroy()

A Communicator is an MPI communicator (mpi4py's): the processes that pass the
same unique id form it, ordered by the ranks they pass.
"""

from __future__ import annotations

import os

from goep.core.typing import (
    BFLOAT16,
    CHAR,
    DOUBLE,
    FLOAT,
    FLOAT4X2,
    FLOAT8E4M3,
    FLOAT8E5M2,
    FLOAT16,
    FLOAT32,
    FLOAT64,
    HALF,
    INT,
    INT8,
    INT32,
    INT64,
    UINT8,
    UINT32,
    UINT64,
    NcclDataType,
    NcclInvalid,
)

__all__ = [
    "Communicator", "NcclDataType", "NcclInvalid", "UniqueId", "get_unique_id",
    "INT8", "CHAR", "UINT8", "INT32", "INT", "UINT32", "INT64", "UINT64", "FLOAT16", "HALF", "FLOAT32", "FLOAT",
    "FLOAT64", "DOUBLE", "BFLOAT16", "FLOAT8E4M3", "FLOAT8E5M2", "FLOAT4X2",
]

UNIQUE_ID_BYTES = 128  # as NCCL's ncclUniqueId


class UniqueId:
    """The name of a communicator to be: 128 random bytes that one process
    makes (:func:`get_unique_id`) and sends to the others (it pickles, so
    ``comm.bcast`` sends it; ``as_bytes`` and :meth:`from_bytes` too)."""

    __slots__ = ("_bytes",)

    def __init__(self, data: bytes = bytes(UNIQUE_ID_BYTES)) -> None:
        b = bytes(data)
        if len(b) != UNIQUE_ID_BYTES:
            raise NcclInvalid(f"a unique id is {UNIQUE_ID_BYTES} bytes, got {len(b)}")
        self._bytes = b

    @classmethod
    def from_bytes(cls, data: bytes) -> UniqueId:
        return cls(data)

    @property
    def as_bytes(self) -> bytes:
        return self._bytes

    def __bytes__(self) -> bytes:
        return self._bytes

    def __eq__(self, other) -> bool:
        return isinstance(other, UniqueId) and other._bytes == self._bytes

    def __hash__(self) -> int:
        return hash(self._bytes)

    def __reduce__(self):
        return (UniqueId, (self._bytes,))

    def __repr__(self) -> str:
        return f"<UniqueId {self._bytes[:8].hex()}...>"


def get_unique_id(empty: bool = False) -> UniqueId:
    """A new unique id (random bytes); ``empty``: all zeros, to be filled by
    :meth:`UniqueId.from_bytes`."""
    return UniqueId(bytes(UNIQUE_ID_BYTES) if empty else os.urandom(UNIQUE_ID_BYTES))


def _local_problem(nranks, rank, unique_id) -> str | None:
    """What is wrong with this process's arguments to Communicator.init, if anything."""
    if not isinstance(unique_id, UniqueId):
        return f"unique_id is a {type(unique_id).__name__}, want a UniqueId (get_unique_id() on one rank, broadcast)"
    if unique_id.as_bytes == bytes(UNIQUE_ID_BYTES):
        return "unique_id is empty (get_unique_id(empty=True), never filled): broadcast the one rank 0 made"
    try:
        n, r = int(nranks), int(rank)
    except (TypeError, ValueError):
        return f"nranks={nranks!r}, rank={rank!r}: want integers"
    if n < 1 or not 0 <= r < n:
        return f"nranks={n}, rank={r}: want nranks >= 1 and 0 <= rank < nranks"
    return None


class Communicator:
    """A communicator of processes, as ``nccl.core.Communicator`` stands in
    NCCL programs: here an MPI communicator (``mpi``, mpi4py's). Make one with
    :meth:`init` (or :meth:`from_mpi`), pass it to ``goep.ep.Group.create``,
    and :meth:`destroy` it once its groups are destroyed."""

    def __init__(self, mpi_comm, owned: bool) -> None:
        self._mpi = mpi_comm
        self._owned = owned

    @classmethod
    def init(cls, nranks: int, rank: int, unique_id: UniqueId, config=None) -> Communicator:
        """The communicator of the processes that pass ``unique_id``, ``rank``
        being this process's place in it and ``nranks`` their number.

        Collective over ``MPI.COMM_WORLD``: every process of the job calls it
        (each with the unique id of the communicator it joins), as NCCL
        programs call ``ncclCommInitRank`` on every rank. Arguments that do
        not fit together (a unique id passed by fewer or more processes than
        their ``nranks``, a rank taken twice, no unique id) raise
        :class:`NcclInvalid` on every process, naming them. ``config``
        (NCCL's communicator options: CTAs, blocking) has no meaning over MPI
        and is ignored."""
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        problem = _local_problem(nranks, rank, unique_id)
        mine = None if problem else (unique_id.as_bytes, int(nranks), int(rank))
        # Every process sees every process's arguments, so that all of them decide alike whether
        # the split below (collective over the world) happens.
        entries = world.allgather((mine, problem))
        errors = [f"process {w} of MPI.COMM_WORLD: {p}" for w, (_, p) in enumerate(entries) if p]
        members: dict[bytes, list[int]] = {}
        for w, (m, _) in enumerate(entries):
            if m is not None:
                members.setdefault(m[0], []).append(w)
        for uid, procs in members.items():
            sizes = sorted({entries[w][0][1] for w in procs})
            ranks = sorted(entries[w][0][2] for w in procs)
            if len(sizes) != 1:
                errors.append(f"the processes {procs} of MPI.COMM_WORLD pass one unique id with nranks {sizes}")
            elif len(procs) != sizes[0]:
                errors.append(f"nranks={sizes[0]}, but {len(procs)} processes of MPI.COMM_WORLD ({procs}) pass its "
                              "unique id")
            elif ranks != list(range(sizes[0])):
                errors.append(f"the processes {procs} of MPI.COMM_WORLD pass ranks {ranks}; want 0 to "
                              f"{sizes[0] - 1}, each once")
        if errors:
            more = f" (and {len(errors) - 4} more)" if len(errors) > 4 else ""
            raise NcclInvalid("Communicator.init: " + "; ".join(errors[:4]) + more)
        comm = world.Split(sorted(members).index(mine[0]), mine[2])
        return cls(comm, owned=True)

    @classmethod
    def from_mpi(cls, comm) -> Communicator:
        """A Communicator over an existing mpi4py communicator, which stays the
        caller's (:meth:`destroy` does not free it)."""
        from mpi4py import MPI

        if not isinstance(comm, MPI.Comm):
            raise NcclInvalid(f"comm is a {type(comm).__name__}; want an mpi4py communicator (e.g. MPI.COMM_WORLD)")
        return cls(comm, owned=False)

    def _check_valid(self, what: str):
        if self._mpi is None:
            raise NcclInvalid(f"cannot {what}: the communicator is destroyed", status=5)
        return self._mpi

    @property
    def mpi(self):
        """The mpi4py communicator."""
        return self._check_valid("read mpi")

    @property
    def nranks(self) -> int:
        return self._check_valid("read nranks").Get_size()

    @property
    def rank(self) -> int:
        return self._check_valid("read rank").Get_rank()

    @property
    def ptr(self) -> int:
        """The MPI_Comm handle."""
        from mpi4py import MPI

        return MPI._handleof(self._check_valid("read ptr"))

    def destroy(self) -> None:
        """Release the communicator (collective over its processes, where
        :meth:`init` made it). Groups created over it work on a duplicate
        and are unaffected; destroy them as usual."""
        if self._mpi is not None:
            comm, self._mpi = self._mpi, None
            if self._owned:
                comm.Free()

    def __repr__(self) -> str:
        if self._mpi is None:
            return "<Communicator destroyed>"
        return f"<Communicator rank {self.rank} of {self.nranks}>"
