"""The one exception tree of kvstore, and its mapping to stable wire error codes.

    KVStoreError
    ├── ConfigError               bad flag, config key or value (never on the wire)
    ├── UsageError                a client call with an invalid argument (also a ValueError)
    ├── ClientClosedError         a call on a client after its close()
    ├── DaemonUnavailable         the daemon cannot be reached or did not answer in time
    └── RequestError              the daemon answered with an error reply
        ├── BadRequestError       malformed frame, wrong type, out-of-range value
        ├── UnknownOpError        an operation this daemon does not know
        ├── VersionError          protocol version mismatch, or no hello yet
        ├── LimitError            batch, message or chunk larger than the daemon allows
        ├── StoreFullError        no space even after evicting everything evictable
        ├── NotFoundError         a key that is not stored
        ├── LeaseError            unknown, expired or foreign lease
        ├── ReservationError      unknown, expired or foreign reservation
        ├── PermissionDeniedError the caller may not do this
        ├── UnavailableError      a tier the request needs is down or timed out
        ├── InternalError         a bug in the daemon; the daemon keeps serving
        └── IncompatibleError     chunk size, key scheme or hash seed differ from what the daemon holds for
                                  the namespace (the client's keys could never hit)

Wire codes are append-only: a code is never renumbered or reused.
"""

from __future__ import annotations


class KVStoreError(Exception):
    """Base of every error kvstore raises."""


class ConfigError(KVStoreError):
    """A configuration file, flag or value is invalid; the message says how to fix it."""


class UsageError(KVStoreError, ValueError):
    """A client call was given an invalid argument (an address, sizes, buffers); the message says which."""


class ClientClosedError(KVStoreError):
    """The client was closed; connect again to make more calls."""


class DaemonUnavailable(KVStoreError):
    """The daemon is not running, not reachable, or did not reply in time."""


class RequestError(KVStoreError):
    """The daemon answered a request with an error reply."""

    code: int = 0

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class BadRequestError(RequestError):
    code = 1


class UnknownOpError(RequestError):
    code = 2


class VersionError(RequestError):
    code = 3


class LimitError(RequestError):
    code = 4


class StoreFullError(RequestError):
    code = 5


class NotFoundError(RequestError):
    code = 6


class LeaseError(RequestError):
    code = 7


class ReservationError(RequestError):
    code = 8


class PermissionDeniedError(RequestError):
    code = 9


class UnavailableError(RequestError):
    code = 10


class InternalError(RequestError):
    code = 11


class IncompatibleError(RequestError):
    code = 12


_BY_CODE: dict[int, type[RequestError]] = {
    cls.code: cls
    for cls in (
        BadRequestError, UnknownOpError, VersionError, LimitError, StoreFullError,
        NotFoundError, LeaseError, ReservationError, PermissionDeniedError,
        UnavailableError, InternalError, IncompatibleError,
    )
}
assert len(_BY_CODE) == 12, "wire error codes must be unique"


def error_from_code(code: int, message: str) -> RequestError:
    """Rebuild the exception a daemon's error reply stands for (unknown codes become InternalError)."""
    return _BY_CODE.get(code, InternalError)(message)


def error_name(exc: RequestError) -> str:
    return type(exc).__name__
