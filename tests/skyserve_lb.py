"""SkyServe 0.14.1's own load balancer (`sky.serve.load_balancer.SkyServeLoadBalancer`) on a loopback port.

It runs with SkyPilot's python, as on a SkyServe controller: the real FastAPI/uvicorn proxy, its httpx client pool
per replica, its TLS (`service.tls` -> `TLSCredential`, uvicorn's ssl_keyfile/ssl_certfile). Only the controller
it syncs with is stood in for: a one-route HTTP server answering `POST /controller/load_balancer_sync` with the
replica URLs, in the shape `SkyServeController` sends (`{"replica_info": {url: {...}}}`).
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx

from searchrl.deploy import skypilot
from searchrl.http import wait_until_ready
from searchrl.processes import stop_process
from tests.conftest import REPO, free_port

LB_SCRIPT = r"""
import json, logging, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from sky.serve import serve_utils
from sky.serve.load_balancer import SkyServeLoadBalancer

replicas, port, keyfile, certfile = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]


class Controller(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"replica_info": {url: {} for url in replicas}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


controller = ThreadingHTTPServer(("127.0.0.1", 0), Controller)
threading.Thread(target=controller.serve_forever, daemon=True).start()
logging.disable(logging.INFO)  # the proxy logs every request (and its headers) at INFO
tls = serve_utils.TLSCredential(keyfile=keyfile, certfile=certfile) if keyfile else None
SkyServeLoadBalancer(controller_url=f"http://127.0.0.1:{controller.server_port}", load_balancer_port=port,
                     tls_credential=tls).run()
"""


def self_signed_cert(folder: Path, ip: str = "127.0.0.1") -> tuple[Path, Path]:
    """(key, cert): docs/deploy.md section 7's openssl command, for a load balancer at `ip`."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=searchrl-retrieval", "-addext", f"subjectAltName=IP:{ip}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return key, cert


@contextlib.contextmanager
def skyserve_load_balancer(
    replicas: list[str],
    *,
    tls: tuple[Path, Path] | None = None,
    timeout_s: float = 60.0,
    ready_status: int = 200,
) -> Iterator[str]:
    """Yield the load balancer's URL once it proxies to `replicas` (its first controller sync is after 5 s); with
    no replicas, once it answers `ready_status` 503 ("no ready replicas", what it says during an outage)."""
    port = free_port()
    key, cert = (str(tls[0]), str(tls[1])) if tls else ("", "")
    verify = ssl.create_default_context(cafile=cert) if tls else True
    proc = subprocess.Popen(
        [skypilot.sky_python(), "-c", LB_SCRIPT, json.dumps(replicas), str(port), key, cert],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    scheme = "https" if tls else "http"
    url = f"{scheme}://127.0.0.1:{port}"

    def proxies() -> bool:  # /health passes through the proxy to a replica once the controller sync listed it
        if proc.poll() is not None:
            raise RuntimeError(f"SkyServe's load balancer exited: {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        return httpx.get(url + "/health", verify=verify, timeout=2).status_code == ready_status

    try:
        if not wait_until_ready(proxies, timeout_s=timeout_s, interval_s=0.2):
            raise TimeoutError(f"SkyServe's load balancer on {url} did not proxy within {timeout_s}s")
        yield url
    finally:
        stop_process(proc, grace_s=10)
