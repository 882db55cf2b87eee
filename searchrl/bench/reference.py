"""A reference-like retrieval server: one encode + one FAISS search per request, no batcher (issue 24).

    python -m searchrl.bench.reference --model DIR --index FILE --corpus JSONL --port N

Why: the service must not be slower for one client than the simplest server a user could write, which is
what Search-R1's `retrieval_server.py` is: a FastAPI app whose synchronous `/retrieve` handler encodes the
request's queries with the model in fp32 torch, searches a FAISS index read into RAM, and looks the rows up
in a corpus held in memory. This is our own minimal equivalent of that path (not a copy), with the same model
folder, FAISS file and corpus the service uses, speaking the same wire format, so `make bench` measures both
in one run with the same load generator. It deliberately has none of the service's machinery: no batching
wait, no cache, no encoder tuning, no thread pinning. OMP_WAIT_POLICY comes from the environment (the bench
passes the service's PASSIVE: see `searchrl.bench.service.start_reference`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel


class QueryRequest(BaseModel):
    """Search-R1's request body (at module level: FastAPI resolves the handler's annotation by name)."""

    queries: list[str]
    topk: int = 3
    return_scores: bool = False


def load_corpus(path: Path) -> list[dict[str, Any]]:
    """Every row of a JSONL corpus, in memory (as Search-R1 does through HF datasets)."""
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def create_reference_app(
    model_dir: str, index_path: Path, corpus_path: Path, *, max_length: int = 256
) -> Any:
    """The FastAPI app: POST /retrieve ({"queries", "topk", "return_scores"}) and GET /health."""
    import faiss
    import numpy as np
    import torch
    from fastapi import FastAPI
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    index = faiss.read_index(str(index_path))  # into RAM, no mmap
    corpus = load_corpus(corpus_path)

    def encode(queries: list[str]) -> np.ndarray:
        batch = tokenizer(queries, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # mean pooling
        pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.numpy().astype(np.float32)

    app = FastAPI(title="reference-like retrieval server")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict[str, Any]:
        # a plain `def`: FastAPI runs it on its thread pool, as Search-R1's handler runs
        scores, rows = index.search(encode(request.queries), request.topk)
        result = []
        for row_ids, row_scores in zip(rows.tolist(), scores.tolist(), strict=True):
            docs = [corpus[r] for r in row_ids if r >= 0]
            if request.return_scores:
                result.append([{"document": d, "score": s} for d, s in zip(docs, row_scores, strict=False)])
            else:
                result.append(docs)
        return {"result": result}

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="encoder folder (transformers format)")
    parser.add_argument("--index", type=Path, required=True, help="FAISS index file")
    parser.add_argument("--corpus", type=Path, required=True, help="JSONL corpus, rows in index order")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-length", dest="max_length", type=int, default=256)
    args = parser.parse_args(argv)
    app = create_reference_app(args.model, args.index, args.corpus, max_length=args.max_length)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
