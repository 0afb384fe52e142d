"""The daemon: sockets and lifecycle (``daemon.py``), one handler per wire operation (``handlers.py``)."""
