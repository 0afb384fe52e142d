"""Who the KV cache events are published for: the daemon-wide stream, and one stream per connected engine.

``--events-topic`` is a template. A plain string (no placeholder; vLLM's default, the empty string, is one) is
the topic of every batch, as it always was. A template with ``{engine_id}``, ``{model}``, ``{dp_rank}`` or
``{tenant}`` (the tenant owning the engine's namespace, from the tenants table when the engine joined) (the
default, ``kv@{engine_id}@{model}``, is the topic llm-d's indexer parses) is rendered per engine identity
(``protocol/engine_identity.py``) that a connected client gave at hello: each such engine gets the events of the
chunks of its namespace on its own topic, with its data-parallel rank in the batch, while everything (raw
clients' chunks included) still goes out on the daemon-wide stream, whose topic is then the empty string.

Each topic is a stream of its own: its own ``seq`` from 0, its own ``AllBlocksCleared`` when its engine connects
(followed by what the namespace already holds), its own replay and snapshot. An engine is published for while
at least one session that named it is open; the last one closing (its stream, its process) ends it.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from ..defaults import DEFAULT_TENANT
from ..errors import ConfigError
from .engine_identity import EngineIdentity

PLACEHOLDERS = ("engine_id", "model", "dp_rank", "tenant")
DEFAULT_TOPIC = "kv@{engine_id}@{model}"


@dataclass(frozen=True)
class TopicTemplate:
    """``--events-topic``, checked: a plain topic or a template of ``PLACEHOLDERS``."""

    text: str
    per_engine: bool

    @classmethod
    def parse(cls, text: str) -> "TopicTemplate":
        """Check ``text``.

        Raises:
            ConfigError: an unknown placeholder, a format spec or conversion, or an unmatched brace.
        """
        names: list[str] = []
        try:
            for _, name, spec, conversion in string.Formatter().parse(text):
                if name is None:
                    continue
                if name not in PLACEHOLDERS or spec or conversion:
                    raise ConfigError(f"--events-topic: {{{name}}} is not a placeholder it knows; use "
                                      f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)} (or {{{{ }}}} for a brace)")
                names.append(name)
        except ValueError as exc:
            raise ConfigError(f"--events-topic: {exc} in {text!r}; write a literal brace as {{{{ or }}}}") from None
        return cls(text, bool(names))

    @property
    def plain(self) -> bytes:
        """The daemon-wide stream's topic: the text itself, or the empty string for a per-engine template."""
        return b"" if self.per_engine else self.text.encode()

    def render(self, identity: EngineIdentity, tenant: str = DEFAULT_TENANT) -> bytes:
        """The topic of ``identity``, an engine of ``tenant``."""
        return self.text.format(engine_id=identity.engine_id, model=identity.model, dp_rank=identity.dp_rank,
                                tenant=tenant).encode()


@dataclass(frozen=True)
class Target:
    """One stream a batch goes to: its topic and the ``data_parallel_rank`` its batches carry."""

    topic: bytes
    rank: int = 0


class Audience:
    """The engine identities of the open sessions, per namespace, counted per session."""

    def __init__(self, template: TopicTemplate) -> None:
        self.template = template
        self._sessions: dict[tuple[str, EngineIdentity], int] = {}
        self._targets: dict[str, dict[EngineIdentity, Target]] = {}

    def join(self, namespace: str, identity: EngineIdentity, tenant: str = DEFAULT_TENANT) -> Target | None:
        """A session of ``identity`` opened in ``namespace`` (owned by ``tenant``). Returns its target when this
        is the first open session of that engine there (its stream starts), else None (already published for,
        or the topic is plain: the daemon-wide stream serves it)."""
        slot = (namespace, identity)
        self._sessions[slot] = self._sessions.get(slot, 0) + 1
        if self._sessions[slot] > 1 or not self.template.per_engine:
            return None
        target = Target(self.template.render(identity, tenant), identity.dp_rank)
        self._targets.setdefault(namespace, {})[identity] = target
        return target

    def leave(self, namespace: str, identity: EngineIdentity) -> None:
        """A session of ``identity`` in ``namespace`` closed: the last one ends its stream."""
        slot = (namespace, identity)
        left = self._sessions.get(slot, 0) - 1
        if left > 0:
            self._sessions[slot] = left
            return
        self._sessions.pop(slot, None)
        engines = self._targets.get(namespace, {})
        engines.pop(identity, None)
        if not engines:
            self._targets.pop(namespace, None)

    def targets(self, namespace: str | None) -> list[Target]:
        """The engine streams a change in ``namespace`` goes to (None: a change of every namespace)."""
        if namespace is None:
            return [t for engines in self._targets.values() for t in engines.values()]
        engines = self._targets.get(namespace)
        return list(engines.values()) if engines else []

    def namespaces_of(self, topic: bytes) -> tuple[list[str], int]:
        """The namespaces whose engines publish on ``topic``, and the rank of the first of them (0: none)."""
        found = [(ns, t.rank) for ns, engines in self._targets.items() for t in engines.values() if t.topic == topic]
        return [ns for ns, _ in found], found[0][1] if found else 0

    def engines(self) -> int:
        """Engine streams published now."""
        return sum(len(engines) for engines in self._targets.values())

    def topics(self) -> dict[str, int]:
        """The topics published for engines now, each with its rank (for ``kvstore stats``)."""
        return {t.topic.decode(errors="replace"): t.rank for engines in self._targets.values()
                for t in engines.values()}
