"""Which models sglang 0.5.12 reads back (trainer/weight_sync/sglang_readback.py), checked against the sglang 0.5.12 wheel.

sglang does not run here (CUDA only), but its wheel downloads from PyPI (7.8 MB): the table the plan refuses by is
derived from its `srt/models/*.py` here, so a hand-written list cannot drift from the pinned source.
"""

from __future__ import annotations

import ast
import json
import zipfile
from pathlib import Path

import pytest

from searchrl.deploy.train_settings import node_settings
from searchrl.errors import ConfigError
from searchrl.trainer.settings import TrainSettings
from searchrl.trainer.weight_sync import sglang_readback as readback
from searchrl.trainer.weight_sync.sglang_readback import (
    READBACK_ARCHITECTURES,
    model_architecture,
    readback_refusal,
)

MODELS = "sglang/srt/models/"


def _classes(wheel: Path) -> tuple[dict[str, list[tuple[list[str], bool]]], set[str]]:
    """Every class of sglang's model files (its bases' names, whether it defines get_weights_by_name), and the
    architectures the files register (`EntryClass`)."""
    classes: dict[str, list[tuple[list[str], bool]]] = {}
    entries: set[str] = set()
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if not (name.startswith(MODELS) and name.endswith(".py")):
                continue
            for node in ast.parse(zf.read(name)).body:
                if isinstance(node, ast.ClassDef):
                    defines = any(
                        isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                        and f.name == "get_weights_by_name"
                        for f in node.body
                    )
                    bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                    classes.setdefault(node.name, []).append((bases, defines))
                elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
                ):
                    value = node.value
                    items = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
                    entries |= {ast.unparse(e) for e in items}
    return classes, entries


def _reads_back(name: str, classes: dict[str, list[tuple[list[str], bool]]], seen: frozenset[str]) -> bool:
    if name in seen or name not in classes:
        return False
    return any(
        defines or any(_reads_back(b, classes, seen | {name}) for b in bases)
        for bases, defines in classes[name]
    )


def test_the_read_back_table_is_what_the_sglang_wheel_defines(sglang_wheel: Path) -> None:
    assert sglang_wheel.name.startswith(f"sglang-{readback.SGLANG_VERSION}-")
    classes, entries = _classes(sglang_wheel)
    derived = {e for e in entries if _reads_back(e, classes, frozenset())}
    assert derived == READBACK_ARCHITECTURES
    # the four files that define it, as the issue read them
    defining = {c for c, versions in classes.items() if any(d for _, d in versions)}
    assert defining == {"LlamaForCausalLM", "OPTForCausalLM", "GraniteForCausalLM", "Exaone4ForCausalLM"}
    assert {"Qwen2ForCausalLM", "Qwen3ForCausalLM"} <= entries - derived
    # and the route answers None (HTTP 400) for a class without it: the TODO the plan cites
    with zipfile.ZipFile(sglang_wheel) as zf:
        runner = zf.read("sglang/srt/model_executor/model_runner.py").decode()
    assert "TODO: (chenyang) Add support for Qwen models." in runner


def test_model_families_and_local_configs_name_their_architecture(tmp_path: Path) -> None:
    assert model_architecture("Qwen/Qwen2.5-3B-Instruct") == "Qwen2ForCausalLM"
    assert model_architecture("Qwen/Qwen3-4B") == "Qwen3ForCausalLM"
    assert model_architecture("meta-llama/Llama-3.2-3B-Instruct") == "LlamaForCausalLM"
    assert model_architecture("someone/unheard-of-7b") is None
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert model_architecture(str(tmp_path)) == "LlamaForCausalLM"  # a local folder: its own config wins
    assert readback_refusal(str(tmp_path)) is None
    assert readback_refusal("someone/unheard-of-7b") is None  # the first sync's check still stops it, loudly


def test_sglang_with_the_default_qwen2_model_is_refused_with_one_line_and_the_fix() -> None:
    with pytest.raises(ValueError) as err:
        TrainSettings(rollout_name="sglang")
    message = str(err.value)
    assert "ROLLOUT=sglang cannot check the weight sync of Qwen/Qwen2.5-3B-Instruct" in message
    assert "Qwen2ForCausalLM has no get_weights_by_name" in message and "use ROLLOUT=vllm" in message
    # the plan's one line, as `make train DRY_RUN=1 NODES=2 ROLLOUT=sglang` prints it (tests/test_sky_make.py)
    with pytest.raises(ConfigError, match=r"the trainer would refuse these settings \(ROLLOUT=sglang cannot"):
        node_settings({"ROLLOUT": "sglang"}, nnodes=2, gpus_per_node=8)
    llama = TrainSettings(rollout_name="sglang", model_name="meta-llama/Llama-3.2-3B-Instruct")
    assert llama.rollout_name == "sglang"
    assert TrainSettings().rollout_name == "vllm"  # the default run is untouched
