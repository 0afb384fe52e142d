"""The client library (``client.py``) and its transport (``transport.py``)."""
