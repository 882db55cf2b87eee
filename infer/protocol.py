"""The protocol of an eval run: everything that decides its numbers, recorded in the result and hashed.

`build_protocol` records the model, endpoint, engine, retrieval backend, corpus and index checksums from the
service's GET /, the shared rollout rules, decoding, prompt format, question-set checksum, ...; `protocol_hash`
(sha256 of the fields that change what is measured) names the run's files, so a changed protocol gets another
file, never a silent overwrite or a resume into an older run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from searchrl import __version__
from searchrl.infer.llm import PINNED_DECODING
from searchrl.infer.settings import InferSettings
from searchrl.prompt import prompt_version


def default_label(settings: InferSettings, backend: str) -> str:
    """`model, backend, search|no-search`, then what else sets one run of a model apart from another: a prompt
    format other than searchrl, and the repo's chat template in place of the model's (`searchrl compare` needs
    one label per run)."""
    model = settings.model.rstrip("/").split("/")[-1]
    parts = [model, backend if settings.search else "none", "search" if settings.search else "no-search"]
    if settings.prompt_format != "searchrl":
        parts.append(f"{settings.prompt_format} format")
    if settings.chat_template != "model":
        parts.append(f"{settings.chat_template} template")
    return ", ".join(parts)


def _sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _checksums(info: Any, prefix: str = "") -> dict[str, Any]:
    """Every field of GET / that names a checksum/hash (corpus_sha256, index_checksum, ...), flattened."""
    out: dict[str, Any] = {}
    if isinstance(info, dict):
        for k, v in info.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                out.update(_checksums(v, key + "."))
            elif any(t in k.lower() for t in ("sha", "checksum", "hash", "fingerprint")):
                out[key] = v
    return out


# GET / fields that decide what a search returns (web: provider, page mode, locale, blocklist; index: corpus
# and index checksums, encoder; hybrid: RRF settings and each part, nested). Counters and URLs are left out.
_IDENTITY_KEYS = (
    "backend",
    "provider",
    "engine",
    "page_mode",
    "gl",
    "hl",
    "blocklist_sha256",
    "corpus",
    "corpus_checksum",
    "corpus_sha256",
    "index_type",
    "index_fingerprint",
    "index_checksum",
    "encoder",
    "rrf_k",
    "weights",
    "depth",
)


def retrieval_identity(info: Any) -> dict[str, Any]:
    """What identifies the results a retrieval service returns, from its GET /, with hybrid parts nested.

    Part of the protocol hash: changing the web provider, page mode or locale, or a hybrid part's index,
    gives another hash and another result file, never a resume into the old one.
    """
    if not isinstance(info, dict):
        return {}
    out: dict[str, Any] = {k: info[k] for k in _IDENTITY_KEYS if info.get(k) is not None}
    if isinstance(info.get("parts"), list):
        out["parts"] = [retrieval_identity(p) for p in info["parts"]]
    return out


# Fields of the protocol that do not change what is measured: where things ran, when, and the run's name.
_UNHASHED = {
    "label",
    "endpoint",
    "started_at",
    "wall_s",
    "searchrl_version",
    "protocol_hash",
    "max_failure_rate",
    "decoding_dropped_by_server",  # learnt while running; the same server drops the same fields again
}


def protocol_hash(protocol: dict[str, Any]) -> str:
    """sha256 (first 10 hex) of what decides the numbers: model, rules, decoding, retrieval, question set."""
    core = {k: v for k, v in protocol.items() if k not in _UNHASHED}
    retrieval = dict(core.get("retrieval") or {})
    retrieval.pop("urls", None)
    retrieval.pop("info", None)
    core["retrieval"] = retrieval
    qa = dict(core.get("qa") or {})
    qa.pop("path", None)
    core["qa"] = qa
    blob = json.dumps(core, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def build_protocol(
    settings: InferSettings,
    *,
    retrieval_info: dict[str, Any] | None,
    qa_path: Path,
    n_questions: int,
    chat_template: str | None,
    model_identity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    info = retrieval_info or {}
    backend = str(info.get("backend", "unknown")) if settings.search else "none"
    spec = settings.rollout
    protocol: dict[str, Any] = {
        "label": settings.label or default_label(settings, backend),
        "model": settings.model,
        "tokenizer": settings.tokenizer or settings.model,
        "engine": settings.engine,
        "api": settings.api,
        "endpoint": {"server": settings.llm_url, "sglang": "sglang (managed)"}.get(
            settings.engine, f"local:{settings.device}"
        ),
        "chat_template_sha256": hashlib.sha256(chat_template.encode()).hexdigest() if chat_template else None,
        # which template rendered: the model's own (checked to keep tools=) or the repo's (--chat-template searchrl)
        "chat_template_source": settings.chat_template,
        # what the server (model path, weight version) or the local files say identifies the weights
        "model_identity": model_identity or {},
        "search": settings.search,
        "retrieval": {
            "urls": settings.retrieval_urls if settings.search else [],
            "backend": backend,
            "corpus": info.get("corpus"),
            "checksums": _checksums(info),
            "identity": retrieval_identity(info) if settings.search else {},
            "info": info,
        },
        "rollout": spec.model_dump(),
        "topk": spec.topk,
        "max_turns": spec.max_turns,
        "max_tokens_per_turn": spec.max_tokens_per_turn,
        "max_response_tokens": spec.max_response_tokens,
        "passage_max_chars": spec.passage_max_chars,
        "max_observation_chars": settings.observation_budget,
        "max_observation_tokens": settings.max_observation_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "seed": settings.seed,
        # every field each generation request carries (infer/llm.py PINNED_DECODING: no server default leaks in)
        "decoding": {
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "seed": settings.seed,
            **PINNED_DECODING,
            "deterministic_inference": settings.engine == "sglang" and settings.deterministic,
        },
        "stop_after_tool_call": settings.stop_after_tool_call,
        "malformed_feedback": settings.malformed_feedback,
        "prompt_format": spec.prompt_format,
        "prompt_version": prompt_version(spec.prompt_format),
        "max_failure_rate": settings.max_failure_rate,
        "qa": {
            "source": settings.qa,
            "path": str(qa_path),
            "sha256": _sha256_file(qa_path),
            "datasets": settings.dataset_filter,
            "limit": settings.limit,
            "sample_seed": settings.sample_seed,
            "n": n_questions,
        },
        "searchrl_version": __version__,
    }
    protocol["protocol_hash"] = protocol_hash(protocol)
    return protocol


__all__ = ["build_protocol", "default_label", "protocol_hash", "retrieval_identity"]
