"""The vLLM connector's typed config: `kv_connector_extra_config` read once, every key checked.

`VllmConnectorConfig.from_extra` is the only reader of the raw dict: each key's type, default and range are
declared here, an unknown key is refused in one line naming it and the known keys, and every other part of the
connector reads the frozen record.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from kvstore.errors import ConfigError
from kvstore.protocol.engine_identity import MAX_ENGINE_ID_CHARS, MAX_MODEL_CHARS, name_fault

from ..common.fingerprint import MODES
from .retention import Retention
from .settings import load_mode, verify_fraction


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"kvstore {key} must be true or false, not {value!r}")


def _int(key: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ConfigError(f"kvstore {key} must be a whole number of at least {least}, not {value!r}")
    if value < least:
        raise ConfigError(f"kvstore {key} must be at least {least}, not {value!r}")
    return int(value)


def _seconds(key: str, value: Any, positive: bool) -> float:
    bound = "above 0" if positive else "0 or more"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"kvstore {key} must be a number of seconds {bound}, not {value!r}")
    if value < 0 or (positive and value == 0) or value != value:
        raise ConfigError(f"kvstore {key} must be a number of seconds {bound}, not {value!r}")
    return float(value)


def _text(key: str, value: Any, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"kvstore {key} must be a string, not {value!r}")
    return value


def _name(key: str, value: Any, kind: str, limit: int) -> str | None:
    """An optional name the daemon checks at hello (`engine_id`, `served_model_name`), checked here first."""
    text = _text(key, value, optional=True)
    fault = name_fault(kind, text, limit) if text else None
    if fault:
        raise ConfigError(f"kvstore {key} {fault}")
    return text or None


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"kvstore {key} must be one of {', '.join(repr(a) for a in allowed)}, not {value!r}")
    return str(value)


def _priority_retention(value: Any) -> tuple[tuple[int, Retention], ...]:
    """``{"0": "pin", "10": "low"}``: the highest priority (a whole number, vLLM's: lower is more important) that
    gets each class (``retention.py``), as (priority, class) pairs sorted by priority."""
    key = "priority_retention"
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(f"kvstore {key} must be a table of priority -> class, e.g. {{\"0\": \"high\", "
                          f"\"10\": \"low\"}}, not {value!r}")
    pairs = []
    for priority, name in value.items():
        try:
            level = int(priority)
        except (TypeError, ValueError):
            raise ConfigError(f"kvstore {key}: {priority!r} is not a whole-number priority") from None
        try:
            pairs.append((level, Retention(name)))
        except (ValueError, TypeError):
            raise ConfigError(f"kvstore {key}: priority {priority!r} maps to {name!r}, not one of "
                              f"{', '.join(r.value for r in Retention)}") from None
    return tuple(sorted(pairs))


@dataclass(frozen=True)
class VllmConnectorConfig:
    """The keys of `kv_connector_extra_config` (the table in docs/connectors/vllm.md)."""

    address: str | None = None          # None: the default socket
    chunk_tokens: int = 256             # a multiple of vLLM's block size (checked where the block size is known)
    load_async: str = "auto"            # "auto", "async" or "sync" (`settings.load_mode`)
    save_async: bool = True
    max_save_bytes: int = 1 << 30
    lookup_batch: int = 64
    timeout: float = 2.0
    retry_s: float = 5.0
    model_id: str | None = None         # None: the served model and revision
    cache_salt: str = ""
    gpu_tier: bool = True
    verify_fraction: float = 0.0
    engine_id: str | None = None        # None: the host name, with "-dp<rank>" under data parallelism
    served_model_name: str | None = None   # None: vLLM's served model name
    priority_retention: tuple[tuple[int, Retention], ...] = ()   # (): a request's priority picks no class
    fingerprint: str = "sampled"        # the weights' fingerprint: "sampled", "full" or "off" (``identity.py``)
    weights_version: str = ""           # the weights' version before any reset_cache() ("": as loaded)

    @classmethod
    def known_keys(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> "VllmConnectorConfig":
        """Check and type `kv_connector_extra_config`.

        Args:
            extra: the dict vLLM was given (None or empty: every default).
        Returns:
            The frozen config.
        Raises:
            ConfigError: an unknown key, or a value of the wrong type or out of range (one line naming it).
        """
        raw = dict(extra or {})
        known = cls.known_keys()
        for key in raw:
            if key not in known:
                raise ConfigError(f"kvstore: unknown kv_connector_extra_config key {key!r}; "
                                  f"known keys: {', '.join(known)}")
        d = cls()
        model = _text("model_id", raw.get("model_id", d.model_id), optional=True)
        return cls(
            address=_text("address", raw.get("address", d.address), optional=True),
            chunk_tokens=_int("chunk_tokens", raw.get("chunk_tokens", d.chunk_tokens), 1),
            load_async=load_mode(raw.get("load_async", d.load_async)),
            save_async=_bool("save_async", raw.get("save_async", d.save_async)),
            max_save_bytes=_int("max_save_bytes", raw.get("max_save_bytes", d.max_save_bytes), 1),
            lookup_batch=_int("lookup_batch", raw.get("lookup_batch", d.lookup_batch), 1),
            timeout=_seconds("timeout", raw.get("timeout", d.timeout), positive=True),
            retry_s=_seconds("retry_s", raw.get("retry_s", d.retry_s), positive=False),
            model_id=model or None,
            cache_salt=str(_text("cache_salt", raw.get("cache_salt", d.cache_salt), optional=False)),
            gpu_tier=_bool("gpu_tier", raw.get("gpu_tier", d.gpu_tier)),
            verify_fraction=verify_fraction(raw.get("verify_fraction", d.verify_fraction)),
            engine_id=_name("engine_id", raw.get("engine_id", d.engine_id), "engine_id", MAX_ENGINE_ID_CHARS),
            served_model_name=_name("served_model_name", raw.get("served_model_name", d.served_model_name),
                                    "model", MAX_MODEL_CHARS),
            priority_retention=_priority_retention(raw.get("priority_retention")),
            fingerprint=_choice("fingerprint", raw.get("fingerprint", d.fingerprint), MODES),
            weights_version=str(_text("weights_version", raw.get("weights_version", d.weights_version),
                                      optional=False)),
        )
