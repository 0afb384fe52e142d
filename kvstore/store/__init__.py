"""The daemon's state: the chunk index, eviction order, leases and reservations, behind the ``Store`` facade."""
