"""A TCP link on loopback that can be cut: bytes stop crossing it, in both directions, and what
was in flight is dropped, while both ends keep their connections open.

That is a network partition as a peer sees it, which SIGSTOP is not: a stopped process's kernel
still accepts bytes into its socket buffer and hands them over when it wakes. (This kernel has
no `tc netem`; a relay in user space stands in for a cable pulled.)
"""

from __future__ import annotations

import select
import socket
import threading


class CuttableLink:
    """Listens on `port`, forwards every connection to `target` until `cut()`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._cut = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()

    def close(self) -> None:
        self._stop.set()
        self._server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                near, _ = self._server.accept()
                far = socket.create_connection(self.target, timeout=5)
            except OSError:
                if self._stop.is_set():
                    return
                continue
            threading.Thread(target=self._pump, args=(near, far), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    if not self._cut.is_set():  # cut: read and dropped, as on a dead cable
                        peers[s].sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()
