"""Socket-level reliability scenarios: a 200 MB chunked body and 400 connections trickling a byte a second,
each against one replica (searchrl/bench/reliability.py runs them in its table)."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from searchrl.bench.replicas import replicas
from searchrl.retrieval.settings import RetrievalSettings


def big_body(settings: RetrievalSettings, workdir: Path, *, megabytes: int = 200) -> dict[str, Any]:
    """Stream a `megabytes` chunked JSON body (no Content-Length) while timing /health every 20 ms."""
    with replicas(settings, 1, workdir / "big-body") as (r,):
        rss_before = r.rss()
        rss_peak = rss_before
        health: list[float] = []
        done = threading.Event()
        result: dict[str, Any] = {}

        def send() -> None:
            sock = socket.create_connection(("127.0.0.1", r.port))
            head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            sent = 0
            chunk = b'"q",' * 16384  # 64 KiB of short queries
            piece = b"%x\r\n%s\r\n" % (len(chunk), chunk)
            try:
                sock.sendall(head + b'%x\r\n{"queries":[\r\n' % len(b'{"queries":['))
                while sent < megabytes * 2**20:
                    sock.sendall(piece)
                    sent += len(chunk)
            except OSError:
                pass
            result["sent_mb"] = round(sent / 2**20, 1)
            sock.settimeout(5)
            try:
                result["status_line"] = sock.recv(200).split(b"\r\n")[0].decode()
            except OSError as exc:
                result["status_line"] = f"no answer ({type(exc).__name__})"
            sock.close()
            done.set()

        sender = threading.Thread(target=send)
        sender.start()
        with httpx.Client(timeout=5) as h:
            until = time.monotonic() + 1.0  # and at least one second of probes
            while not done.is_set() or time.monotonic() < until:
                started = time.monotonic()
                h.get(r.url + "/health")
                health.append(time.monotonic() - started)
                rss_peak = max(rss_peak, r.rss())
                time.sleep(0.02)
        sender.join()
        rss_after = r.rss()
    return {
        "scenario": f"{megabytes} MB chunked body",
        **result,
        "rss_before_mb": round(rss_before / 2**20, 1),
        "rss_peak_mb": round(rss_peak / 2**20, 1),
        "rss_after_mb": round(rss_after / 2**20, 1),
        "limit_mb": round(settings.max_body_bytes / 2**20, 1),
        "health_max_ms": round(max(health, default=0.0) * 1000, 1),
        "health_probes": len(health),
    }


def slow_clients(
    settings: RetrievalSettings, workdir: Path, *, n: int = 400, header_timeout_s: float = 3.0
) -> dict[str, Any]:
    """`n` connections sending one byte a second: half still in the headers, half in a declared body."""
    env = {
        "SEARCHRL_RETRIEVAL_HEADER_TIMEOUT_S": str(header_timeout_s),
        "SEARCHRL_RETRIEVAL_BODY_TIMEOUT_S": str(header_timeout_s),
    }
    with replicas(settings, 1, workdir / "slow", env) as (r,):
        socks: list[socket.socket] = []
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", r.port))
            if i % 2:  # headers done, the body trickles (JSON whitespace)
                s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            else:  # the headers trickle (a header value that never ends)
                s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            s.setblocking(False)
            socks.append(s)
        started = time.monotonic()
        open_ = set(range(n))
        closed_at: list[float] = []
        status: Counter[str] = Counter()
        limit = header_timeout_s * 3 + 5
        while open_ and time.monotonic() - started < limit:
            for i in list(open_):
                try:
                    data = socks[i].recv(4096)
                    if data:
                        status[data.split(b"\r\n")[0].decode(errors="replace")] += 1
                        socks[i].send(b" " if i % 2 else b"a")
                        continue
                    closed = True
                except BlockingIOError:
                    try:
                        socks[i].send(b" " if i % 2 else b"a")  # the trickle: one byte per loop (~1 s)
                        closed = False
                    except OSError:
                        closed = True
                except OSError:
                    closed = True
                if closed:
                    open_.discard(i)
                    closed_at.append(time.monotonic() - started)
            time.sleep(1.0)
        health = httpx.get(r.url + "/health", timeout=5).status_code
        for s in socks:
            s.close()
    return {
        "scenario": f"{n} slow connections (1 byte/s), header/body deadline {header_timeout_s:g}s",
        "connections": n,
        "closed_by_server": n - len(open_),
        "still_open": len(open_),
        "last_closed_s": round(max(closed_at, default=0.0), 1),
        "answers": dict(status),
        "health_after": health,
    }


__all__ = ["big_body", "slow_clients"]
