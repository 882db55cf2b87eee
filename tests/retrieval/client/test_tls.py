"""`service.tls` end to end: SkyServe's own load balancer with a self-signed certificate (IP subjectAltName) in
front of the real retrieval server, and our clients trusting it through SEARCHRL_RETRIEVAL_CA_BUNDLE.

The certificate is made with docs/deploy.md section 7's openssl command; the load balancer is SkyServe 0.14.1's
(tests/skyserve_lb.py), serving HTTPS with uvicorn's ssl_keyfile/ssl_certfile as on a controller; the replica
behind it is `create_app` with a bearer token on a loopback port.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from searchrl.cli import main
from searchrl.deploy.tls import REMOTE_CA_BUNDLE
from searchrl.errors import ConfigError, RetrievalUnavailableError
from searchrl.retrieval.client import CA_BUNDLE_ENV, RetrievalClient, check_health
from searchrl.retrieval.client.corpus_check import fetch_service_info
from searchrl.retrieval.serving.app import create_app
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import REPO, TINY_CORPUS, TINY_QA
from tests.infer.conftest import chat_tokenizer_dir, serve_scripts  # noqa: F401 (a fixture, used by name)
from tests.infer.test_agent import MODEL, TRAINED
from tests.live import serve_in_thread
from tests.skyserve_lb import self_signed_cert, skyserve_load_balancer

pytestmark = pytest.mark.live

TOKEN = "tls-test-token-5e1f"


@pytest.fixture(scope="module")
def cert_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def https_url(cert_pair: tuple[Path, Path]) -> Iterator[str]:
    settings = RetrievalSettings(backend="bm25", corpus=str(TINY_CORPUS), api_key=TOKEN)
    with (
        serve_in_thread(create_app(settings)) as replica,
        skyserve_load_balancer([replica], tls=cert_pair) as lb,
    ):
        yield lb


def _search(url: str, **kw: object) -> list[str]:
    async def go() -> list[str]:
        async with RetrievalClient(url, TOKEN, max_retries=2, **kw) as client:  # type: ignore[arg-type]
            return [hit.title for hit in (await client.search(["Who directed The Seventh Seal?"], 3))[0]]

    return asyncio.run(go())


def test_the_client_trusts_the_load_balancers_certificate_through_the_ca_bundle(
    https_url: str, cert_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert https_url.startswith("https://127.0.0.1:")
    assert "The Seventh Seal" in _search(https_url, ca_bundle=cert_pair[1])
    monkeypatch.setenv(CA_BUNDLE_ENV, str(cert_pair[1]))  # how the verl tool on a training node gets it
    assert "The Seventh Seal" in _search(https_url)
    # the launch's checks on the node: the health probe and the corpus check (GET /) over the same TLS
    health = check_health(https_url, TOKEN, deadline_s=10)
    assert health.ok, health.reason
    assert fetch_service_info(https_url, TOKEN)["service"] == "searchrl-retrieval"


def test_without_the_ca_bundle_one_attempt_fails_naming_the_setting(https_url: str) -> None:
    client = RetrievalClient(https_url, TOKEN, max_retries=3)

    async def go() -> None:
        async with client:
            await client.search(["Who directed The Seventh Seal?"], 3)

    with pytest.raises(RetrievalUnavailableError) as info:
        asyncio.run(go())
    assert info.value.kind == "tls"
    assert "certificate verify failed" in str(info.value) and f"{CA_BUNDLE_ENV}=<PEM file>" in str(info.value)
    assert client.retries == 0  # the same certificate fails the same way: not retried
    health = check_health(https_url, TOKEN, deadline_s=5)
    assert not health.ok and CA_BUNDLE_ENV in health.reason


def test_a_certificate_for_another_address_is_refused(https_url: str, tmp_path: Path) -> None:
    _, other = self_signed_cert(tmp_path, ip="10.20.30.40")  # e.g. made before the controller's IP was known
    with pytest.raises(RetrievalUnavailableError, match="certificate verify failed") as info:
        _search(https_url, ca_bundle=other)
    assert info.value.kind == "tls"


def test_a_missing_ca_bundle_is_a_config_error_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CA_BUNDLE_ENV, "/nonexistent/cert.pem")
    with pytest.raises(ConfigError, match=rf"^{CA_BUNDLE_ENV}=/nonexistent/cert.pem: no such file"):
        RetrievalClient("https://10.0.0.1:30001", TOKEN)
    RetrievalClient("http://10.0.0.1:30001", TOKEN)  # plain HTTP never reads it


def _sky_train_dry_run(url: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RETRIEVAL_API_KEY": TOKEN, **extra_env}
    argv = ["sky", "train", "--dry-run", "--env", f"RETRIEVAL_SERVICE_URL={url}",
            "--env", "CHECKPOINT_BUCKET=my-searchrl-ckpts", "--env", "DATASET_SIZE=small",
            "--env", "ALLOW_SMALL_CORPUS=1"]  # fmt: skip
    return subprocess.run([sys.executable, "-m", "searchrl", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)  # fmt: skip


def test_sky_train_checks_the_https_service_and_mounts_the_certificate_on_every_node(
    https_url: str, cert_pair: tuple[Path, Path]
) -> None:
    proc = _sky_train_dry_run(https_url, {CA_BUNDLE_ENV: str(cert_pair[1])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ok:" in proc.stderr  # the health check went through SkyServe's TLS load balancer
    task = yaml.safe_load(proc.stdout)
    assert task["envs"]["RETRIEVAL_SERVICE_URL"] == https_url
    assert task["file_mounts"][REMOTE_CA_BUNDLE] == str(
        cert_pair[1].resolve()
    )  # file_mounts reach every node
    assert task["envs"][CA_BUNDLE_ENV] == REMOTE_CA_BUNDLE  # ... and the clients there read that copy
    assert task["file_mounts"]["/checkpoints"]["name"] == "my-searchrl-ckpts"
    assert TOKEN not in proc.stdout and TOKEN not in proc.stderr


def test_sky_train_without_the_certificate_refuses_in_one_line(https_url: str, tmp_path: Path) -> None:
    proc = _sky_train_dry_run(https_url, {})
    assert proc.returncode == 2 and not proc.stdout
    (line,) = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith(f"error: retrieval service {https_url} failed its health check"), line
    assert f"{CA_BUNDLE_ENV}=<PEM file>" in line
    proc = _sky_train_dry_run(https_url, {CA_BUNDLE_ENV: str(tmp_path / "missing.pem")})
    assert proc.returncode == 2 and f"{CA_BUNDLE_ENV}={tmp_path / 'missing.pem'}: no such file" in proc.stderr


def test_the_verl_search_tool_on_a_node_trusts_the_mounted_certificate(
    https_url: str, cert_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from searchrl.trainer.plugins.tool import SearchTool

    monkeypatch.setenv("RETRIEVAL_API_KEY", TOKEN)
    monkeypatch.setenv(CA_BUNDLE_ENV, str(cert_pair[1]))  # as the task's envs set it on every node
    tool = SearchTool({"type": "native", "retrieval_urls": [https_url], "timeout_s": 5.0, "max_retries": 1})

    async def go() -> str:
        try:
            instance_id, _ = await tool.create(create_kwargs={"question": "q"})
            response, _, metrics = await tool.execute(instance_id, {"query_list": ["The Seventh Seal"]})
            assert metrics["failed"] == 0, metrics
            return str(response.text)
        finally:
            await tool.aclose()

    assert "Doc 1 (Title: The Seventh Seal)" in asyncio.run(go())


def test_searchrl_eval_trusts_the_ca_bundle_for_the_services_description(
    https_url: str,
    cert_pair: tuple[Path, Path],
    chat_tokenizer_dir: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bug 1 of issue 33: eval's `GET /` (the protocol's backend and corpus) went out with httpx's default trust,
    so against a `service.tls` endpoint it refused the run ("no retrieval service answered") though the searches
    trusted SEARCHRL_RETRIEVAL_CA_BUNDLE. Both go through RetrievalClient now."""
    monkeypatch.setenv(CA_BUNDLE_ENV, str(cert_pair[1]))
    monkeypatch.setenv("RETRIEVAL_API_KEY", TOKEN)
    for llm_url, _ in serve_scripts({MODEL: TRAINED}):
        rc = main(
            ["eval", "--model", MODEL, "--tokenizer", str(chat_tokenizer_dir), "--llm-url", llm_url,
             "--retrieval-url", https_url, "--qa", str(TINY_QA), "--max-turns", "2", "--output-dir", str(tmp_path)]
        )  # fmt: skip
    assert rc == 0
    (result,) = tmp_path.glob("*.json")
    doc = json.loads(result.read_text())
    assert doc["protocol"]["retrieval"]["backend"] == "bm25" and doc["protocol"]["retrieval"]["urls"] == [
        https_url
    ]
    assert doc["summary"]["retrieval_after"]["url"] == https_url  # GET / again after the run, same trust
