"""Regenerate README's report picture from a SCRIPTED model (no GPU here), with the real eval and report code.

    .venv/bin/python -m tests.infer.readme_report /tmp/report    # then copy report.png over docs/images/

What is real: the retrieval service (BM25 over the bundled Wikipedia subset in data/, on a loopback port), the
30-question dev set, `searchrl eval` / `searchrl compare`, scoring, intervals and the chart. What is scripted:
the model. "trained" searches the question once and answers with a golden answer only if that answer appears in
the passages it got back (else "unknown"); "base" answers from memory, right on a fixed 40% of questions. The
third run is "trained" behind a proxy that fails every search for one question in six (HTTP 503), so the
picture shows what failure columns and an invalid run look like. The numbers say nothing about any real model.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchrl.cli import main
from searchrl.infer.scripted import Turn, create_scripted_app
from searchrl.retrieval.app import create_app
from searchrl.retrieval.settings import RetrievalSettings
from tests.infer.conftest import build_tokenizer
from tests.live import serve_in_thread

REPO = Path(__file__).resolve().parents[2]
DEV = REPO / "tests" / "fixtures" / "dev_qa.jsonl"
ROWS = [json.loads(line) for line in DEV.read_text().splitlines() if line.strip()]


def _bucket(text: str, n: int) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16) % n


def _row_for(prompt: str) -> dict[str, Any]:
    for r in ROWS:
        if r["question"].rstrip("?") in prompt:
            return r
    raise KeyError("question not found")


class _ReadmePolicy:
    """base-3b answers 2 questions in 5 from memory; trained-3b searches, then answers if the gold is in view."""

    models = ("base-3b", "trained-3b")

    def reply(self, model: str, turn: Turn) -> str:
        row = _row_for(turn.question_turn)
        gold = row["golden_answers"][0]
        if model == "base-3b":
            return f"<answer> {gold if _bucket(row['id'], 5) < 2 else 'unknown'} </answer>"
        if turn.observation is None:
            call = {"name": "search", "arguments": {"query_list": [row["question"]]}}
            return f"<think>Let me search.</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
        found = any(re.search(re.escape(g), turn.observation, re.IGNORECASE) for g in row["golden_answers"])
        return f"<answer> {gold if found else 'unknown'} </answer>"


def scripted_model() -> FastAPI:
    return create_scripted_app(_ReadmePolicy())


def flaky_proxy(upstream: str) -> FastAPI:
    """Forwards to the real service; every search for one question in six answers 503 (a dying replica)."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/")
    async def info() -> Any:
        async with httpx.AsyncClient() as c:
            return (await c.get(upstream + "/")).json()

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        body = await request.json()
        if any(_bucket(q, 6) == 0 for q in body.get("queries", [])):
            return JSONResponse({"detail": "replica unavailable"}, status_code=503)
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.post(upstream + "/retrieve", json=body)
        return JSONResponse(r.json(), status_code=r.status_code)

    return app


def run(out_dir: Path) -> Path:
    work = Path(tempfile.mkdtemp(prefix="readme-report-"))
    tok_dir = work / "tokenizer"
    tok_dir.mkdir()
    build_tokenizer(tok_dir, DEV)
    settings = RetrievalSettings(backend="bm25", data_dir=REPO / "data")
    with serve_in_thread(create_app(settings)) as wiki, serve_in_thread(flaky_proxy(wiki)) as flaky:
        with serve_in_thread(scripted_model()) as llm:
            common = [
                "--tokenizer",
                str(tok_dir),
                "--llm-url",
                f"{llm}/v1",
                "--output-dir",
                str(work / "results"),
            ]
            common += ["--qa", str(DEV), "--concurrency", "4"]
            main(["eval", "--model", "base-3b", "--no-search", "--label", "base-3b, no search", *common])
            main(
                [
                    "eval",
                    "--model",
                    "trained-3b",
                    "--retrieval-url",
                    wiki,
                    "--label",
                    "trained-3b, wiki bm25",
                    *common,
                ]
            )
            main(
                [
                    "eval",
                    "--model",
                    "trained-3b",
                    "--retrieval-url",
                    flaky,
                    "--label",
                    "trained-3b, flaky",
                    *common,
                ]
            )
    rc = main(
        [
            "compare", str(work / "results"), "--allow-invalid", "--out", str(work / "report"),
            "--title", "scripted model (not a real LLM): n, 95% intervals, failures",
        ]
    )  # fmt: skip
    assert rc == 0
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "report.png"
    shutil.copy(work / "report" / "report.png", target)
    print((work / "report" / "report.md").read_text())  # noqa: T201  (the tables, for the README)
    return target


if __name__ == "__main__":
    # never the tracked docs/images by default: a run must not silently replace README's picture
    default = Path(tempfile.gettempdir()) / "searchrl-report"
    print(run(Path(sys.argv[1]) if len(sys.argv) > 1 else default))  # noqa: T201
