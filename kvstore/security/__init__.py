"""Who may connect: CURVE key files (``keys.py``) and CURVE on the tcp:// socket with a client
allow-list (``curve.py``)."""

from .curve import ClientCurve, ServerCurve, check_tcp_exposure, is_loopback
from .keys import KeyPair, generate_keypair, load_allowed_keys, load_public_key, load_secret_keypair

__all__ = ["ClientCurve", "ServerCurve", "check_tcp_exposure", "is_loopback", "KeyPair", "generate_keypair",
           "load_allowed_keys", "load_public_key", "load_secret_keypair"]
