"""The bookkeeping of the tiers below DRAM: one ledger a tier (``disk``, ``gpu``, ``remote``), the interface
the Store calls them through (``base``) and the builder of one Store's set (``builder``).

A ledger changes its tier's fields of an entry and its queues and records intents; the tier's mover (in
``tiers/``) does the I/O. Ledgers may import ``tiers/`` (media and I/O) and the rest of ``store/``; ``tiers/``
never imports them: a mover sees its ledger through the interfaces of ``tiers/ledger_api.py``, which these fit.
"""
