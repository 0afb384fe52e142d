"""kvstore: a tiered KV-cache storage daemon for LLM inference, and its client.

    import kvstore
    client = kvstore.connect(namespace="llama-3-8b/bf16/tp0of1", chunk_tokens=256)
    keys = client.chunk_keys(token_ids)
    n = client.lookup(keys)
    client.put(keys, buffers)
    with client.get(keys[:n]) as views:
        ...
"""

from ._version import __version__
from .client.client import Client, Lease, LookupResult, connect
from .errors import (
    BadRequestError, ClientClosedError, ConfigError, DaemonUnavailable, IncompatibleError, InternalError,
    KVStoreError, LeaseError, LimitError, PermissionDeniedError, RequestError, ReservationError,
    StoreFullError, UnavailableError, UnknownOpError, UsageError, VersionError,
)
from .keys import chunk_keys

__all__ = [
    "__version__", "connect", "Client", "Lease", "LookupResult", "chunk_keys",
    "KVStoreError", "ConfigError", "UsageError", "ClientClosedError", "DaemonUnavailable", "RequestError",
    "BadRequestError", "UnknownOpError", "VersionError", "LimitError", "StoreFullError",
    "LeaseError", "ReservationError", "PermissionDeniedError", "UnavailableError", "InternalError",
    "IncompatibleError",
]
