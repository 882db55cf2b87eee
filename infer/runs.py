"""The runs `searchrl compare` puts side by side: result files loaded, or the model x backend x tools matrix run.

    searchrl compare --models Qwen/Qwen2.5-3B-Instruct@http://h:30000/v1,ckpt/merged@http://h:30001/v1 \\
        --backends wiki=http://h:8000,google=http://h:8001 --tools on,off --qa dev --out reports/

`run_matrix` runs `searchrl eval` for every cell of the matrix (search off runs once per model: it does not
depend on the backend), each under its own label; `load_runs` reads the result files back, refusing two runs
under one label. infer/comparison.py checks and computes, infer/report.py renders.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.errors import ConfigError, DataError
from searchrl.infer.comparison import service_label
from searchrl.infer.evaluate import run_eval
from searchrl.infer.protocol import default_label
from searchrl.infer.settings import InferSettings
from searchrl.infer.summary import run_label

log = logging.getLogger(__name__)


# --- the matrix ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    name: str  # served model name / HF id
    url: str | None = None  # OpenAI-compatible base URL; None = the settings' llm_url


def parse_models(spec: str) -> list[ModelSpec]:
    """`NAME[@URL],NAME[@URL],...`"""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, url = part.partition("@")
        if not name or (sep and not url.startswith(("http://", "https://"))):
            raise ConfigError(f"--models entry {part!r} must be NAME or NAME@http(s)://host:port/v1")
        out.append(ModelSpec(name=name, url=url or None))
    if not out:
        raise ConfigError("--models is empty; give NAME[@URL] entries separated by commas")
    short = [m.name.rstrip("/").split("/")[-1] for m in out]
    dupes = sorted({s for s in short if short.count(s) > 1})
    if dupes:
        raise ConfigError(
            f"--models entries share the name {dupes}, so their results would overwrite each other; "
            "serve them under distinct names (sglang/vLLM --served-model-name)"
        )
    return out


def parse_backends(spec: str) -> list[tuple[str, str]]:
    """`[LABEL=]URL,...` (one retrieval service per backend). An entry without a label ("") is named after what
    the service says it serves (`service_label`), so a column cannot be labelled for another corpus."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        label, sep, url = part.partition("=") if "=" in part else ("", "", part)
        if (sep and not label) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"--backends entry {part!r} must be [LABEL=]http(s)://host:port")
        out.append((label, url))
    if not out:
        raise ConfigError("--backends is empty; give LABEL=URL entries separated by commas")
    return out


def parse_tools(spec: str) -> list[bool]:
    values = {"on": True, "off": False}
    out = []
    for part in (p.strip().lower() for p in spec.split(",")):
        if part not in values:
            raise ConfigError(f"--tools entry {part!r} must be on or off")
        out.append(values[part])
    return out


def run_matrix(
    base: InferSettings,
    models: Sequence[ModelSpec],
    backends: Sequence[tuple[str, str]],
    tools: Sequence[bool] = (True, False),
    *,
    progress: bool = True,
) -> list[Path]:
    """Evaluate every (model, backend, search on/off) cell and return the result files, in matrix order."""
    paths = []
    backends = [
        (label or service_label(_service_info(url, base.retrieval_api_key_value())), url)
        for label, url in backends
    ]
    for m in models:
        for search in tools:
            cells = backends if search else [("none", base.retrieval_url)]
            for backend_label, url in cells:
                overrides: dict[str, Any] = {
                    "model": m.name,
                    "search": search,
                    "retrieval_url": url,
                    "label": None,
                }
                if m.url:
                    overrides["llm_url"] = m.url
                s = base.with_changes(**overrides)
                s = s.with_changes(label=default_label(s, backend_label))
                log.info("running %s", s.label)
                path, _ = run_eval(s, progress=progress)
                paths.append(path)
    return paths


def _service_info(url: str, api_key: str | None) -> dict[str, Any]:
    import asyncio

    from searchrl.infer.evaluate import fetch_retrieval_info

    return asyncio.run(fetch_retrieval_info([url], api_key))


# --- loading -------------------------------------------------------------------------------------------------
def load_runs(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Result documents from files or directories of `*.json` (directories sorted by name)."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(p.glob("*.json")))
        elif p.exists():
            files.append(p)
        else:
            raise DataError(f"result file {p} not found; run `searchrl eval` first")
    runs = []
    for f in files:
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{f}: not a JSON result file ({exc.msg})") from exc
        if not isinstance(doc, dict) or not {"protocol", "summary", "per_dataset", "questions"} <= doc.keys():
            raise DataError(
                f"{f}: not a `searchrl eval` result (needs protocol, summary, per_dataset, questions)"
            )
        runs.append(doc)
    if not runs:
        raise DataError(f"no result files in {', '.join(map(str, paths))}")
    labels = [run_label(r) for r in runs]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise DataError(f"two result files share the label {dupes}; re-run one with --label")
    return runs


__all__ = ["ModelSpec", "load_runs", "parse_backends", "parse_models", "parse_tools", "run_matrix"]
