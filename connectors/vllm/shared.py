"""What both halves of the vLLM connector share: its settings, the engine's KV cache geometry and the daemon links.

`KVStoreConnector` (``kvstore.connectors.vllm``) reads the settings once; its scheduler half
(``_vllm_scheduler``) and its worker half (``_vllm_worker``) each get this record and open the daemon
links they use through it, so one object owns (and closes) every link of one connector instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvstore.keys import KEY_SCHEME
from kvstore.protocol.engine_identity import EngineIdentity

from ..common import canonical
from ..common.layout import PagedGeometry, paged_namespace, session_namespace
from ..common.store import ChunkStore, DaemonLink
from .config import VllmConnectorConfig
from .geometry import EngineGeometry


@dataclass
class ConnectorSettings:
    """One connector instance's settings (`kv_connector_extra_config` and what vLLM's config says)."""

    geometry: EngineGeometry | None      # None: the connector is off (a cache it does not describe)
    chunk_tokens: int
    model_id: str
    salt: str
    tp_size: int
    load_enabled: bool                   # kv_role kv_both or kv_consumer
    save_enabled: bool                   # kv_role kv_both or kv_producer
    save_async: bool
    config: VllmConnectorConfig          # kv_connector_extra_config, checked
    links: list[DaemonLink] = field(default_factory=list)
    identity: EngineIdentity | None = None   # who this engine is to its router (said at hello)
    model_identity: str = ""             # the weights' fingerprint and KV settings (scheduler: ``identity.py``)

    @property
    def timeout(self) -> float:
        return self.config.timeout

    @property
    def session_namespace(self) -> str:
        """The namespace this engine's links say hello with, which its chunks are bound to in the daemon: the
        engine-neutral ``kv:MODEL`` for the canonical format, ``vllm:MODEL`` for chunks of vLLM's own blocks."""
        if self.geometry is not None and self.geometry.canonical is not None:
            return canonical.canonical_session(self.model_id, self.salt)
        return session_namespace(f"vllm:{self.model_id}", self.salt)

    @property
    def key_scheme(self) -> str:
        """The key scheme this engine's links say at hello (the daemon checks it per namespace)."""
        if self.geometry is not None and self.geometry.canonical is not None:
            return canonical.KEY_SCHEME
        return KEY_SCHEME

    def link(self, **connect: Any) -> DaemonLink:
        """A new link to the daemon (a client is not thread-safe: one per thread that calls it)."""
        connect = {"namespace": self.session_namespace, "key_scheme": self.key_scheme, **connect}
        if self.identity is not None:
            connect = {"identity": self.identity, **connect}
        link = DaemonLink.to(self.config.address, self.chunk_tokens, timeout=self.timeout,
                             retry_s=self.config.retry_s, connect=connect)
        self.links.append(link)
        return link

    def chunk_store(self, tp_rank: int, link: DaemonLink, paged: PagedGeometry | None = None,
                    stage: str | None = None) -> ChunkStore:
        """The chunks of one tensor-parallel rank (none for MLA) of one pipeline stage (this one's by default)."""
        g = self.geometry
        assert g is not None
        if g.canonical is not None:
            first, end = canonical.rank_heads(tp_rank, self.tp_size, g.canonical.kv_heads)
            layout = canonical.CanonicalLayout(g.canonical.num_layers, g.canonical.kv_heads, g.canonical.head_dim,
                                               g.canonical.dtype, g.canonical.chunk_tokens, first, end)
            return canonical.CanonicalStore(link, layout, canonical.identity_root(self.model_identity), self.salt)
        ns = paged_namespace(f"vllm:{self.model_id}", paged or g.paged, tp_rank=0 if g.mla else tp_rank,
                             tp_size=1 if g.mla else self.tp_size, salt=self.salt, replicated=g.mla,
                             stage=stage if paged is not None else g.stage)
        return ChunkStore(link, ns, paged or g.paged)

    def close_links(self) -> None:
        for link in self.links:
            link.close()
        self.links.clear()
