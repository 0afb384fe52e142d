"""KV cache events: the publisher (a PUB socket written on the event loop, a ROUTER serving replay). Imports no
other room of the daemon."""
