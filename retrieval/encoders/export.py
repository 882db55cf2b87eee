"""The query encoder on ONNX Runtime: exported from the same weights as the torch encoder, cached beside the index.

Why: on a CPU replica the query encoder bounds the service (issue 14). ONNX Runtime's fused BERT kernels
(graph optimisation level ALL) and dynamic int8 quantisation (VNNI on AVX-512/AVX-VNNI CPUs) run the same
model several times faster than eager torch, with no change to tokenisation or pooling.

Variants (`VARIANTS`):
  onnx-fp32   the torch weights exported with `torch.onnx.export(dynamo=False)` (the TorchScript exporter works
              offline and needs no onnxscript), optimised by ORT when the session is created
  onnx-int8   onnx-fp32 with `onnxruntime.quantization.quantize_dynamic` (int8 weights, per channel; activations
              quantised at run time), which costs a little accuracy: the quality gate in
              retrieval/encoders/tuning.py decides whether the service may use it

Cache layout, beside the index the vectors were built for:
  <index_dir>/encoders/<weights fingerprint>/onnx-fp32.onnx  + onnx-fp32.json
                                              onnx-int8.onnx  + onnx-int8.json
The weights fingerprint hashes the tensors the torch encoder actually loaded (so a changed model never reuses a
stale export); each .json records its own file fingerprint (sha256), the versions that made it, and the gate
results per index fingerprint. A file whose hash no longer matches its .json is exported again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from searchrl.errors import ConfigError
from searchrl.retrieval.encoders.encoder import Encoder, pool_hidden

if TYPE_CHECKING:
    from searchrl.retrieval.encoders.encoder import EncoderSpec

log = logging.getLogger(__name__)

VARIANTS = ("onnx-fp32", "onnx-int8")
ENCODERS_DIR = "encoders"
OPSET = 17
_SAMPLE_TEXTS = ["who directed the seventh seal", "capital of australia", "x"]


def onnxruntime_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def weights_fingerprint(encoder: Encoder) -> str:
    """sha256 over the loaded tensors (names, shapes, dtypes, bytes): identifies the weights, not the path.

    ~0.1 s for MiniLM (90 MB), ~0.5 s for E5-base; paid once per start-up.
    """
    import torch

    digest = hashlib.sha256()
    digest.update(json.dumps(encoder.spec.to_dict(), sort_keys=True).encode())
    digest.update(str(encoder.max_length).encode())
    state = encoder.model.state_dict()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu", torch.float32).contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:16]


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def export_dir(index_dir: Path, fingerprint: str) -> Path:
    return Path(index_dir) / ENCODERS_DIR / fingerprint


def read_sidecar(path: Path) -> dict[str, Any] | None:
    """The .json next to an exported model, or None when missing/unreadable/not matching its file."""
    sidecar = path.with_suffix(".json")
    if not (path.is_file() and sidecar.is_file()):
        return None
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("file_sha256") != file_sha256(path):
        log.warning("exported encoder %s does not match its fingerprint; exporting it again", path)
        return None
    return meta


def write_sidecar(path: Path, meta: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".json.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path.with_suffix(".json"))


def _export_fp32(encoder: Encoder, target: Path) -> None:
    """torch -> ONNX with dynamic batch and sequence axes, from an eager-attention copy of the same weights."""
    import torch
    from transformers import AutoModel

    # SDPA attention traces into a graph that ORT does not fuse; eager attention exports to the plain
    # MatMul/Softmax pattern that ORT's BERT fusion recognises. Same weights: loaded from the same reference.
    model = AutoModel.from_pretrained(encoder.ref, dtype=torch.float32, attn_implementation="eager").eval()
    sample = encoder.tokenizer(_SAMPLE_TEXTS, padding=True, return_tensors="pt")
    names = [n for n in encoder.tokenizer.model_input_names if n in sample]

    class _Hidden(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any) -> Any:
            return self.inner(**dict(zip(names, args, strict=True))).last_hidden_state

    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]}
    # The tracer warns about constants it records (the mask's fill value, advanced indexing); the export is
    # checked against torch instead, by the quality gate and tests/retrieval/encoders/test_encoder.py.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Hidden(model),
            tuple(sample[n] for n in names),
            str(target),
            dynamo=False,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=OPSET,
        )


def _quantize_int8(source: Path, target: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # per_channel: one scale per output channel of each weight matrix; per-tensor scales lost ~2x more cosine
    # to the fp32 vectors on MiniLM (measured: min cosine 0.92 vs 0.98 on short queries).
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True)


def ensure_export(encoder: Encoder, index_dir: Path, variant: str, fingerprint: str | None = None) -> Path:
    """The exported model file for `variant`, exporting (and quantising) it into the cache first if needed."""
    if variant not in VARIANTS:
        raise ConfigError(f"unknown ONNX variant {variant!r}; use one of {', '.join(VARIANTS)}")
    import onnxruntime
    import torch

    fingerprint = fingerprint or weights_fingerprint(encoder)
    folder = export_dir(index_dir, fingerprint)
    path = folder / f"{variant}.onnx"
    if read_sidecar(path) is not None:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    staging = folder / f".{variant}.{uuid.uuid4().hex[:8]}.onnx"
    try:
        if variant == "onnx-fp32":
            _export_fp32(encoder, staging)
        else:
            _quantize_int8(ensure_export(encoder, index_dir, "onnx-fp32", fingerprint), staging)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)  # only left when the export failed
    meta = {
        "variant": variant,
        "weights_fingerprint": fingerprint,
        "file_sha256": file_sha256(path),
        "encoder": encoder.spec.to_dict(),
        "max_length": encoder.max_length,
        "opset": OPSET,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "export_seconds": round(time.perf_counter() - started, 2),
        "gate": {},
    }
    write_sidecar(path, meta)
    log.info("exported %s of %s to %s in %.1fs", variant, encoder.spec.name, path, meta["export_seconds"])
    return path


class OnnxEncoder(Encoder):
    """The same tokenizer, prefixes and pooling as the torch `Encoder`; the forward pass runs on ONNX Runtime."""

    backend = "onnx"

    def __init__(
        self,
        spec: EncoderSpec,
        session: Any,
        tokenizer: Any,
        *,
        precision: str,
        max_length: int,
        batch_size: int,
        path: Path,
    ) -> None:
        super().__init__(
            spec,
            None,
            tokenizer,
            device="cpu",
            precision=precision,
            max_length=max_length,
            batch_size=batch_size,
        )
        self.session = session
        self.path = path
        meta = read_sidecar(path) or {}
        self.fingerprint = str(meta.get("file_sha256", ""))[
            :16
        ]  # of the exported file, as `GET /` reports it
        self._inputs = [i.name for i in session.get_inputs()]

    @classmethod
    def open(
        cls, path: Path, base: Encoder, *, threads: int = 0, batch_size: int | None = None
    ) -> OnnxEncoder:
        """A session on an exported file; `threads`: intra-op threads (0: ORT's default, one per core)."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Threads that spin waiting for work starve the event loop and the other workers on a small replica
        # (the same reason retrieval/encoders/encoder.py sets OMP_WAIT_POLICY=PASSIVE for torch).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        precision = "int8" if path.stem.endswith("int8") else "fp32"
        return cls(
            base.spec,
            session,
            base.tokenizer,
            precision=precision,
            max_length=base.max_length,
            batch_size=batch_size or base.batch_size,
            path=path,
        )

    def _forward(self, texts: list[str]) -> np.ndarray:
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="np"
        )
        feed = {name: batch[name].astype(np.int64, copy=False) for name in self._inputs}
        (hidden,) = self.session.run(["last_hidden_state"], feed)
        return pool_hidden(hidden, batch["attention_mask"], self.spec)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model_fingerprint": self.fingerprint}


__all__ = [
    "VARIANTS",
    "OnnxEncoder",
    "ensure_export",
    "onnxruntime_available",
    "read_sidecar",
    "weights_fingerprint",
    "write_sidecar",
]
