"""The host (DRAM) tier: the shared-memory arena (arena.py) and the tier over it (tier.py); its ledger is the
Store's own index."""
