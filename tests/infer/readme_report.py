"""Regenerate the report picture and excerpt in docs/ from a SCRIPTED model (no GPU here), with the real eval and
report code.

    .venv/bin/python -m tests.infer.readme_report /tmp/report    # then copy report.png and report-excerpt.md
                                                                  # over docs/images/

What is real: the retrieval service (BM25 over the bundled Wikipedia subset in data/, on a loopback port), the
30-question dev set (split by hops into two "datasets", single-hop and multi-hop, so the report has an Avg.),
`searchrl eval` / `searchrl compare`, scoring, intervals, tests and the chart. What is scripted: the model.
"trained" searches the question once and answers with a golden answer only if that answer appears in the passages
it got back (else "unknown"); "base" answers from memory, right on a fixed 40% of questions. "flaky" is "trained"
behind a proxy that fails every search for one question in six (HTTP 503), so the picture shows what failure
columns and an invalid run look like; "top-5" is "trained" with 5 passages a search instead of 3, a protocol
difference let through with --allow-protocol-diff, so the report opens with its banner. The numbers say nothing
about any real model.
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
from searchrl.devset import dev_qa_path
from searchrl.infer.scripted import Turn, create_scripted_app
from searchrl.retrieval.serving.app import create_app
from searchrl.retrieval.settings import RetrievalSettings
from tests.conftest import REPO
from tests.infer.conftest import build_tokenizer
from tests.live import healthy_app, serve_in_thread

DEV = dev_qa_path()
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
    app = healthy_app()

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


def split_by_hops(path: Path) -> Path:
    """The dev set with data_source single-hop / multi-hop, so the report has two datasets and an Avg."""
    rows = [{**r, "data_source": "single-hop" if r["hops"] == 1 else "multi-hop"} for r in ROWS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def run(out_dir: Path) -> Path:
    work = Path(tempfile.mkdtemp(prefix="readme-report-"))
    tok_dir = work / "tokenizer"
    tok_dir.mkdir()
    build_tokenizer(tok_dir, DEV)
    qa = split_by_hops(work / "dev_by_hops.jsonl")
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
            common += ["--qa", str(qa), "--concurrency", "4"]
            trained = ["--model", "trained-3b", "--retrieval-url"]
            main(["eval", "--model", "base-3b", "--no-search", "--label", "base-3b, no search", *common])
            main(["eval", *trained, wiki, "--label", "trained-3b, wiki bm25", *common])
            # --keep-going: finish all 30 (the run stops early once it cannot be valid, by default)
            main(["eval", *trained, flaky, "--keep-going", "--label", "trained-3b, flaky", *common])
            main(["eval", *trained, wiki, "--topk", "5", "--label", "trained-3b, wiki bm25, top-5", *common])
    rc = main(
        [
            "compare", str(work / "results"), "--allow-invalid", "--allow-protocol-diff",
            "--baseline", "trained-3b, wiki bm25", "--out", str(work / "report"),
            "--title", "scripted model (not a real LLM): n, 95% intervals, failures",
        ]
    )  # fmt: skip
    assert rc == 0
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "report.png"
    shutil.copy(work / "report" / "report.png", target)
    md = (work / "report" / "report.md").read_text(encoding="utf-8")
    # the excerpt docs/ shows: everything above the per-run protocol tables
    (out_dir / "report-excerpt.md").write_text(
        md[: md.index("## Protocols")].rstrip() + "\n", encoding="utf-8"
    )
    print(md)  # noqa: T201  (the tables, for the docs)
    return target


if __name__ == "__main__":
    # never the tracked docs/images by default: a run must not silently replace README's picture
    default = Path(tempfile.gettempdir()) / "searchrl-report"
    print(run(Path(sys.argv[1]) if len(sys.argv) > 1 else default))  # noqa: T201
