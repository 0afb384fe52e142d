"""The disk tier: chunk files (tier.py), their on-disk format (format.py), the ledger of what is on disk
(ledger.py) and the mover that writes back and promotes (mover.py)."""
