"""What the vLLM connector reads from vLLM: the version it runs in, its settings, the model and the rank.

Each check refuses a bad value with one line naming it and what would be accepted (`ConfigError`).
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import TYPE_CHECKING, Any

from kvstore.errors import ConfigError
from kvstore.protocol.engine_identity import EngineIdentity

from ..common.identity import engine_identity

if TYPE_CHECKING:
    from vllm.config import VllmConfig

SUPPORTED_VLLM = ("0.32", "0.33")


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM whose connector interface this connector was not written against."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if not found or f"{found[1]}.{found[2]}" not in SUPPORTED_VLLM:
        raise ConfigError(f"kvstore's vLLM connector supports vLLM {' and '.join(SUPPORTED_VLLM)}, not {version}: "
                          f"install one of those")


def load_mode(value: Any) -> str:
    """`load_async`: true (always off the step), false (always in it) or "auto" (off it while others run)."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or str(value).lower() in ("true", "false", "1", "0"):
        return "async" if str(value).lower() in ("true", "1") else "sync"
    raise ConfigError(f"kvstore load_async must be true, false or \"auto\", not {value!r}")


def verify_fraction(value: Any) -> float:
    """`verify_fraction`: the share of would-be hits computed and compared instead of loaded, in [0, 1]."""
    try:
        fraction = float(value)
    except (TypeError, ValueError):
        fraction = float("nan")
    if isinstance(value, bool) or not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"kvstore verify_fraction must be a number from 0 to 1 (e.g. 0.01), not {value!r}")
    return fraction


def chosen_for_verify(req_id: str, fraction: float) -> bool:
    """Whether request `req_id` is one of the `fraction` verified: by a hash of its id, so the choice is the
    same every time the scheduler asks about it (and every request at 1.0)."""
    if fraction <= 0.0:
        return False
    draw = int.from_bytes(hashlib.blake2b(req_id.encode(), digest_size=8).digest(), "big") / 2.0 ** 64
    return draw < fraction


def model_id(vllm_config: "VllmConfig") -> str:
    """The served model and revision: part of every namespace (unless `model_id` is configured)."""
    model = getattr(vllm_config, "model_config", None)
    if model is None:
        return "unknown-model"
    revision = getattr(model, "revision", None)
    return f"{model.model}@{revision}" if revision else str(model.model)


def tp_rank(vllm_config: "VllmConfig") -> int:
    """This worker's tensor-parallel rank (each rank has a namespace of its own)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except Exception:  # noqa: BLE001 - not in a distributed worker (tests, single process)
        rank = getattr(vllm_config.parallel_config, "rank", 0) or int(os.environ.get("RANK", 0))
        return rank % vllm_config.parallel_config.tensor_parallel_size


def served_model_name(vllm_config: "VllmConfig") -> str:
    """The model name vLLM serves (its first, when it has several), as clients and routers name the model."""
    model = getattr(vllm_config, "model_config", None)
    name = getattr(model, "served_model_name", None) or getattr(model, "model", None) or ""
    return str(name[0] if isinstance(name, (list, tuple)) and name else name)


def vllm_engine_identity(vllm_config: "VllmConfig", engine_id: str | None, model_name: str | None) -> EngineIdentity:
    """Who this engine is to its router (sent at hello; the daemon publishes its KV cache events on its topic):
    `kv_connector_extra_config`'s `engine_id` and `served_model_name` when set, else the host name and vLLM's
    served model name; the data-parallel rank from vLLM's parallel config.

    Raises:
        ConfigError: a configured `engine_id` or `served_model_name` the daemon would refuse.
    """
    parallel = getattr(vllm_config, "parallel_config", None)
    rank = int(getattr(parallel, "data_parallel_rank", 0) or 0)
    size = int(getattr(parallel, "data_parallel_size", 1) or 1)
    return engine_identity(engine_id, model_name, served_model_name(vllm_config), rank, size)
