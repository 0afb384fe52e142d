"""The one exception tree of kvstore, and its mapping to stable wire error codes.

    KVStoreError
    ├── ConfigError               bad flag, config key or value (never on the wire)
    ├── UsageError                a client call with an invalid argument (also a ValueError)
    ├── ClientClosedError         a call on a client after its close()
    ├── DaemonUnavailable         the daemon cannot be reached or did not answer in time
    ├── RemoteError               a remote store call failed (connection, protocol or server error)
    ├── FormatError (ValueError)  a header, file or record that is not ours, torn, or inconsistent
    │   └── RecordError           a remote value that must not be served
    ├── ChecksumError             stored bytes that do not match their checksum: a miss, never data
    │   └── DamagedSource         a chunk's DRAM bytes no longer match the checksum taken at commit
    └── RequestError              the daemon answered with an error reply
        ├── BadRequestError       malformed frame, wrong type, out-of-range value
        ├── UnknownOpError        an operation this daemon does not know
        ├── VersionError          protocol version mismatch, or no hello yet
        ├── LimitError            batch, message or chunk larger than the daemon allows
        ├── StoreFullError        no space even after evicting everything evictable
        ├── LeaseError            unknown, expired or foreign lease
        ├── ReservationError      unknown, expired or foreign reservation
        ├── PermissionDeniedError the caller may not do this
        ├── UnavailableError      a tier the request needs is down or timed out
        ├── InternalError         a bug in the daemon; the daemon keeps serving
        └── IncompatibleError     chunk size, key scheme or hash seed differ from what the daemon holds for
                                  the namespace (the client's keys could never hit)

Only ``RequestError`` and its subclasses travel on the wire; the others stay inside the process that raised
them (the daemon turns a failed tier read into a miss). Wire codes are append-only: a code is never renumbered
or reused (code 6, once "not found", is retired: a missing key is a miss, never an error).
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


class RemoteError(KVStoreError):
    """A remote store call failed (connection, protocol or server error)."""


class FormatError(KVStoreError, ValueError):
    """A header that is not ours, torn, or inconsistent with its file."""


class RecordError(FormatError):
    """A remote value that must not be served (the caller counts it as a miss)."""


class ChecksumError(KVStoreError):
    """A stored payload whose checksum does not match its header: treated as a miss."""


class DamagedSource(ChecksumError):
    """A chunk's DRAM bytes, about to be written, no longer match the checksum taken at commit."""


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
        LeaseError, ReservationError, PermissionDeniedError,
        UnavailableError, InternalError, IncompatibleError,
    )
}
assert len(_BY_CODE) == 11 and 6 not in _BY_CODE, "wire error codes must be unique"


def error_from_code(code: int, message: str) -> RequestError:
    """Rebuild the exception a daemon's error reply stands for (unknown codes become InternalError)."""
    return _BY_CODE.get(code, InternalError)(message)


def error_name(exc: RequestError) -> str:
    return type(exc).__name__
