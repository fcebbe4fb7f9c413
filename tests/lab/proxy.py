"""A userspace TCP proxy on 127.0.0.1 for faults the kernel here cannot make (no netem).

``TcpProxy(host, port)`` forwards every accepted connection to ``host:port``. Faults are
armed for the next connection(s):

* ``cut_after(n)``: once ``n`` bytes went client -> server, both sockets are reset (RST), as
  when a NAT box or a Wi-Fi link drops a session mid-transfer;
* ``freeze_after(n)``: after ``n`` bytes, nothing more is forwarded either way but both
  sockets stay open, as with a pulled cable (the client sees no error, only silence);
* ``delay_s``: one-way latency added to every chunk in both directions (a delay line, so
  throughput is not capped by the delay).

Events (``cut``, ``frozen``) let tests wait on what happened instead of sleeping.
"""

from __future__ import annotations

import collections
import contextlib
import select
import socket
import struct
import threading
import time


class _Fault:
    def __init__(self, kind: str, after: int) -> None:
        self.kind = kind
        self.after = after


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1", delay_s: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.delay_s = delay_s
        self._listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listen.bind((listen_host, 0))
        self._listen.listen(64)
        self.host, self.port = self._listen.getsockname()
        self._faults: collections.deque[_Fault] = collections.deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self.connections = 0
        self.cuts = 0
        self.cut = threading.Event()  # set each time a connection is cut (clear it to wait again)
        self.frozen = threading.Event()  # set when a connection froze
        self.bytes_up = 0  # client -> server, all connections

    # -- control ------------------------------------------------------------------------------
    def cut_after(self, nbytes: int, count: int = 1) -> None:
        with self._lock:
            self._faults.extend(_Fault("cut", nbytes) for _ in range(count))

    def freeze_after(self, nbytes: int, count: int = 1) -> None:
        with self._lock:
            self._faults.extend(_Fault("freeze", nbytes) for _ in range(count))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> TcpProxy:
        t = threading.Thread(target=self._accept_loop, name="tcpproxy-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listen.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            _reset(s)
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- forwarding ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._listen], [], [], 0.2)
                if not ready:
                    continue
                client, _ = self._listen.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                fault = self._faults.popleft() if self._faults else None
                self._socks += [client, upstream]
                self.connections += 1
            conn = _Conn(self, client, upstream, fault)
            t = threading.Thread(target=conn.run, name="tcpproxy-conn", daemon=True)
            t.start()
            self._threads.append(t)


class _Conn:
    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket, fault: _Fault | None) -> None:
        self.proxy = proxy
        self.client, self.upstream = client, upstream
        self.fault = fault
        self.up = 0
        self.queues = {client: collections.deque(), upstream: collections.deque()}  # by destination

    def run(self) -> None:
        p = self.proxy
        peers = {self.client: self.upstream, self.upstream: self.client}
        try:
            while not p._stop.is_set():
                ready, _, _ = select.select([self.client, self.upstream], [], [], self._wait())
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        self._flush(force=True)
                        return
                    if src is self.client:
                        data = self._count_up(data)
                        if data is None:
                            return
                    self.queues[peers[src]].append((time.monotonic() + p.delay_s, data))
                self._flush()
        except OSError:
            return
        finally:
            if not (self.fault and self.fault.kind == "freeze" and p.frozen.is_set() and not p._stop.is_set()):
                for s in (self.client, self.upstream):
                    with contextlib.suppress(OSError):
                        s.close()

    def _count_up(self, data: bytes) -> bytes | None:
        p = self.proxy
        f = self.fault
        if f is not None and self.up + len(data) >= f.after:
            keep = data[: max(0, f.after - self.up)]
            if keep:
                self.upstream.sendall(keep)
            self.up += len(keep)
            with p._lock:
                p.bytes_up += len(keep)
            if f.kind == "cut":
                _reset(self.client)
                _reset(self.upstream)
                p.cuts += 1
                p.cut.set()
                return None
            p.frozen.set()  # keep both sockets open, forward nothing more
            p._stop.wait()
            return None
        self.up += len(data)
        with p._lock:
            p.bytes_up += len(data)
        return data

    def _wait(self) -> float:
        due = [q[0][0] for q in self.queues.values() if q]
        if not due:
            return 0.2
        return max(0.0, min(due) - time.monotonic())

    def _flush(self, force: bool = False) -> None:
        now = time.monotonic()
        for dest, q in self.queues.items():
            while q and (force or q[0][0] <= now):
                dest.sendall(q.popleft()[1])


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), as a dropped connection looks to the other end."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
