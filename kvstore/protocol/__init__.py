"""The wire protocol between clients and the daemon (see ``wire.py``)."""
