"""Errors of ``goep.ep``, named as ``nccl.ep``/nccl4py name theirs.

Every failure of a C call raises :class:`NCCLError` (or a subclass), with the
result code in ``status`` and the library's message, which names the bad
value. Bad arguments, whether this package or the library finds them, raise
:class:`NcclInvalid`; a peer that stops or stalls raises :class:`NcclTimeout`.
"""

from __future__ import annotations

import builtins

from goep.ep.enums import Result

__all__ = ["NCCLEpError", "NCCLError", "NcclInvalid", "NcclMasked", "NcclMismatch", "NcclRemoteError", "NcclTimeout"]


class NCCLError(Exception):
    """A call of the library failed: ``status`` is its :class:`Result`.
    ``NCCLEpError`` is the same class, under ``nccl.ep``'s name."""

    def __init__(self, status: int, message: str = "") -> None:
        try:
            self.status = Result(status)
            name = self.status.name
        except ValueError:
            self.status = status
            name = f"result {status}"
        self.message = message
        super().__init__(f"{name}: {message}" if message else name)


NCCLEpError = NCCLError


class NcclInvalid(NCCLError, ValueError):
    """A bad argument or a call out of order (InvalidArgument, InvalidUsage),
    found by this package or by the library. Nothing was written and the
    group stays usable: where the call is collective, the other ranks' same
    call fails too (:class:`NcclRemoteError`, naming this rank), and where it
    is ``create_handle``, the dispatch the handle stood for fails on every
    rank."""

    def __init__(self, message: str, status: int = Result.InvalidArgument) -> None:
        super().__init__(status, message)


class NcclTimeout(NCCLError, builtins.TimeoutError):
    """A peer did not arrive within the group's timeout (it stopped or
    stalled): the group is unusable; destroy it (every rank)."""


class NcclRemoteError(NCCLError):
    """Another rank refused the same collective call (its input was bad): this
    call wrote nothing and the group stays usable."""


class NcclMismatch(NCCLError):
    """The ranks' calls no longer match: a rank skipped a call, or made one (or
    created a handle) that the others did not. The message names a rank and
    the call; no result was returned, and the group is unusable on every rank:
    destroy it everywhere."""


class NcclMasked(NCCLError):
    """(enable_mask) The other ranks masked this rank after it stalled; it
    rejoins with :meth:`Group.mask_clean`, called with them."""


def raise_for(status: int, message: str) -> None:
    """Raise the error class of a result code."""
    if status in (Result.InvalidArgument, Result.InvalidUsage):
        raise NcclInvalid(message, status)
    cls = {Result.Timeout: NcclTimeout, Result.RemoteError: NcclRemoteError, Result.Masked: NcclMasked,
           Result.Mismatch: NcclMismatch}.get(status, NCCLError)
    raise cls(status, message)
