"""Reading request traces in Mooncake's FAST'25 format.

One JSON object per line: ``timestamp`` (ms), ``input_length`` and ``output_length`` (tokens) and ``hash_ids``,
the ids of the request's 512-token blocks, and optionally ``tenant``, the name of the tenant that sent it (as
``kvstore simulate --tenants`` names them; block ids of two tenants are two tenants' chunks). The ids are already
chained: an id stands for its block *and* every block before it, so two requests share a block id only if they share the
whole prefix up to it. The last block may be partial (``input_length`` need not be a multiple of the block size).
Requests are kept in file order. Every line is checked, and a bad one is reported with its line number and what to fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import ConfigError

BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Request:
    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    tenant: str = ""   # the tenant that sent it (optional "tenant" field; "" is the shared default tenant)


def read_trace(path: str, limit: int | None = None, block_tokens: int = BLOCK_TOKENS) -> list[Request]:
    """The first ``limit`` requests of the trace at ``path`` (all when None)."""
    requests: list[Request] = []
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if limit is not None and len(requests) >= limit:
                    break
                if line.strip():
                    requests.append(parse_line(line, f"{path}:{number}", block_tokens))
    except FileNotFoundError:
        raise ConfigError(f"trace {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"trace {path} is a directory; give a JSON-lines file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"trace {path} is not UTF-8 text; give a JSON-lines file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc.strerror}") from None
    if not requests:
        raise ConfigError(f"trace {path} holds no requests")
    return requests


def parse_line(line: str, where: str, block_tokens: int = BLOCK_TOKENS) -> Request:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected a JSON object with timestamp, input_length, output_length, hash_ids")
    timestamp = _number(row, "timestamp", where, 0)
    input_length = int(_number(row, "input_length", where))
    output_length = int(_number(row, "output_length", where, 0))
    ids = row.get("hash_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"{where}: hash_ids must be a list of integer block ids")
    if len(ids) * block_tokens < input_length:
        raise ConfigError(f"{where}: {len(ids)} blocks of {block_tokens} tokens cannot hold input_length "
                          f"{input_length}; is the block size {block_tokens}?")
    tenant = row.get("tenant", "")
    if not isinstance(tenant, str) or len(tenant) > 63:
        raise ConfigError(f"{where}: tenant must be a tenant's name (a string of at most 63 characters), "
                          f"got {tenant!r}")
    return Request(timestamp, input_length, output_length, tuple(ids), tenant)


def _number(row: dict, name: str, where: str, default: float | None = None) -> float:
    value = row.get(name, default)
    if value is None:
        raise ConfigError(f"{where}: missing {name!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{where}: {name} must be a non-negative number, got {value!r}")
    return value


def distinct_blocks(requests: list[Request]) -> int:
    return len({b for r in requests for b in r.hash_ids})
