"""A client's own loads, timed and told to the daemon now and then (``server/requests/load_costs.py`` says why)."""

from __future__ import annotations

import math
import time

from ..errors import UsageError
from ..protocol.messages import LOAD_MEDIA


class LoadNotes:
    """Bytes loaded and nanoseconds spent per medium since the last note; a note is due at most every
    ``interval`` seconds (the first at once, so a client that loads once and idles is counted)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._bytes = dict.fromkeys(LOAD_MEDIA, 0)
        self._ns = dict.fromkeys(LOAD_MEDIA, 0)
        self._since = -math.inf

    def add(self, medium: str, nbytes: int, seconds: float) -> bool:
        """Count one load; True when a note is due.

        Raises:
            UsageError: ``medium`` is not one of ``LOAD_MEDIA``, or ``nbytes`` / ``seconds`` is negative.
        """
        if medium not in self._bytes:
            raise UsageError(f"note_load: medium {medium!r} is not one a client loads from; use one of "
                             f"{', '.join(LOAD_MEDIA)}")
        if type(nbytes) is not int or nbytes < 0 or not seconds >= 0:
            raise UsageError(f"note_load: nbytes must be an int >= 0 and seconds >= 0, got {nbytes!r} and "
                             f"{seconds!r}")
        self._bytes[medium] += nbytes
        self._ns[medium] += int(seconds * 1e9)
        return time.monotonic() - self._since >= self.interval

    def take(self) -> dict | None:
        """The note to send (fields of ``LOAD_TIMES``), emptying the sums; None when nothing was loaded."""
        self._since = time.monotonic()
        media = [m for m in LOAD_MEDIA if self._bytes[m]]
        if not media:
            return None
        note = {"media": media, "bytes": [self._bytes[m] for m in media], "ns": [self._ns[m] for m in media]}
        self._bytes = dict.fromkeys(LOAD_MEDIA, 0)
        self._ns = dict.fromkeys(LOAD_MEDIA, 0)
        return note
