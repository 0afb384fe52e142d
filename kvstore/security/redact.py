"""Secrets out of everything shown: the one helper that turns a URL into what logs, stats and errors may print.

A remote store URL may carry a password (``redis://user:password@host``, ``redis://:password@host``), in a URL
nested in its query (``mooncake://m:50051?metadata=http://user:password@m:8080/metadata``) or as a query
parameter (``?password=...``). ``redact_url`` keeps the scheme, user, host and path, which are what an operator
needs to tell stores apart, and replaces every secret with ``***``. Backends keep the real URL to themselves
and expose only this form (``RemoteBackend.url``, ``repr``); the daemon's config line and errors use it too.
"""

from __future__ import annotations

import re

MASK = "***"
# userinfo of any URL in the text: scheme://USER:SECRET@ or scheme://SECRET@ (a bare userinfo may be a secret)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")
_SECRET_PARAM = re.compile(r"(?P<name>(?:^|[?&;])(?:password|passwd|pass|secret|token|auth)=)[^&;#\s]*",
                           re.IGNORECASE)


def _mask_userinfo(match: re.Match) -> str:
    user, colon, _secret = match.group("userinfo").partition(":")
    shown = f"{user}:{MASK}" if colon else MASK
    return f"{match.group('scheme')}{shown}@"


def redact_url(url: str) -> str:
    """``url`` with every password, token and bare userinfo replaced by ``***``."""
    text = _USERINFO.sub(_mask_userinfo, url)
    return _SECRET_PARAM.sub(lambda m: m.group("name") + MASK, text)
