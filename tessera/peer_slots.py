"""Connection slots shared fairly between peers, so that no client can crowd out another.

A server reachable from the cluster cannot refuse newcomers once a fixed number of connections is
open: whoever opens them first (a pod holding idle or slow connections) would then starve everyone
else, the API server or the kubelet's probes included. :class:`PeerSlots` bounds what one peer (an
IP address) may hold, and when every slot is taken it gives the newcomer the oldest slot of the peer
holding the most, unless the newcomer's own peer would then hold as many. A peer can therefore only
ever lose slots to peers holding fewer than it does: a client that keeps a few connections (the API
server, a probe) always gets one, whatever the others open.

It only keeps the books: the server closes what :meth:`PeerSlots.take` names, and calls
:meth:`PeerSlots.release` when a connection ends. Thread-safe, for the thread server's accept loop
and its handler threads.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class Taken(Generic[Key]):
    """What :meth:`PeerSlots.take` decided: whether the newcomer has a slot, and which connection
    (if any) gave it up and must now be closed."""

    admitted: bool
    evicted: Key | None = None


class PeerSlots(Generic[Key]):
    """At most ``total`` connections, at most ``per_peer`` of them from one peer."""

    def __init__(self, total: int, per_peer: int) -> None:
        if not 0 < per_peer <= total:
            raise ValueError(f"per_peer must be 1 to total ({total}), not {per_peer}")
        self.total = total
        self.per_peer = per_peer
        self._held: dict[str, dict[Key, None]] = {}
        """Each peer's connections, oldest first (dicts keep insertion order)."""
        self._count = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._count

    def held_by(self, peer: str) -> int:
        with self._lock:
            return len(self._held.get(peer, ()))

    def take(self, peer: str, key: Key) -> Taken[Key]:
        """A slot for ``key`` from ``peer``: refused at the peer's bound; when all are taken, the
        oldest of the largest holder's, if it holds more than ``peer`` would."""
        with self._lock:
            mine = len(self._held.get(peer, ()))
            if mine >= self.per_peer:
                return Taken(False)
            evicted: Key | None = None
            if self._count >= self.total:
                largest = max(self._held, key=lambda holder: len(self._held[holder]))
                if len(self._held[largest]) <= mine + 1:
                    return Taken(False)
                evicted = next(iter(self._held[largest]))
                self._drop(largest, evicted)
            self._held.setdefault(peer, {})[key] = None
            self._count += 1
            return Taken(True, evicted)

    def release(self, peer: str, key: Key) -> None:
        """Give back ``key``'s slot; harmless for a key evicted or never admitted."""
        with self._lock:
            self._drop(peer, key)

    def _drop(self, peer: str, key: Key) -> None:
        held = self._held.get(peer)
        if held is None or key not in held:
            return
        del held[key]
        self._count -= 1
        if not held:
            del self._held[peer]
