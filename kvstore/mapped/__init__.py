"""What the daemon and the engines' processes both map, in one leaf package that imports no daemon room.

The shared host arena (``arena``), the published index's writer (the daemon's, ``index_writer``) and reader
(every client's, ``index_reader``) side by side with the one layout they share, the daemon's GPU pool as an
engine maps it (``gpu_pool``, over ``pool_ipc``) and the page-locking of a mapping (``page_lock``). The client,
the connectors and ``config.py`` import these and never ``store/``, ``tiers/`` or ``server/``: an engine's
install loads no daemon code. This package may import only the leaves below it (errors, units, logs,
protocol, native, ops).
"""
