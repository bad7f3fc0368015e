"""A TCP relay on loopback that can turn into a black hole: a network fault without root.

A client pointed at the relay reaches the target through it. ``black_hole()`` makes every
connection, open or new, swallow what the client sends and answer nothing, closing nothing: what a
client meets when a route drops packets (a partition, a firewall that drops rather than refuses,
a peer gone without a FIN). Only a client's own timeouts get it out. ``restore()`` closes every
connection made so far (their
streams lost bytes; a healed partition resets them too) and relays new ones again.
"""

from __future__ import annotations

import contextlib
import socket
import threading

_CHUNK = 65536


class TcpRelay:
    """Relays 127.0.0.1:``port`` to 127.0.0.1:``target_port`` until closed."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._dropping = threading.Event()
        self._hanging_up = False
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="tcp-relay", daemon=True).start()

    def black_hole(self) -> None:
        self._dropping.set()

    def hang_up_next(self) -> None:
        with self._lock:
            self._hanging_up = True

    def _take_hang_up(self) -> bool:
        with self._lock:
            taken, self._hanging_up = self._hanging_up, False
            return taken

    def restore(self) -> None:
        """Close every connection made so far and relay new ones again."""
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._sockets.clear()
        self._dropping.clear()

    def close(self) -> None:
        self._closed.set()
        self.restore()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._track(client)
            if self._dropping.is_set():
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._track(upstream)
            for source, sink, from_client in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(source, sink, from_client), daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        """Copy one direction until either side closes; while dropping, read and throw away, and
        pass no close on either (a black hole tells the client nothing). A client's request met by
        ``hang_up_next`` is thrown away and both ends closed."""
        with contextlib.suppress(OSError):
            while data := source.recv(_CHUNK):
                if from_client and self._take_hang_up():
                    for end in (source, sink):
                        with contextlib.suppress(OSError):
                            end.shutdown(socket.SHUT_RDWR)
                    return
                if not self._dropping.is_set():
                    sink.sendall(data)
        if not self._dropping.is_set():
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def _swallow(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while sock.recv(_CHUNK):
                pass
