"""Transport: requests off the sockets (the ZeroMQ reactor, the local stream socket, tcp:// peers' connections)
and the refusal of oversized ones. Imports no other room of the daemon: it is handed a dispatcher."""
