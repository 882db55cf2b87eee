"""Search-R1 QA data -> verl parquet that makes verl's ToolAgentLoop call our search tool.

Run: `searchrl train data --dataset-size small` (or DATASET_SIZE=small). Output, under
`<data_dir>/<size>/`: train.parquet, test.parquet, meta.json. Expected rows, seeded and reproducible:

    small     1,000 train /    200 test
    medium   10,000 train /  2,000 test
    full    169,615 train / 51,713 test   (PeterJinGo/nq_hotpotqa_train: NQ+HotpotQA train; test spans the 7 sets)

Each row carries what verl 0.9's agent loop needs (../shared/DESIGN.md section 3):
  data_source        searchR1_<source>, which verl's reward routing and our reward both understand
  prompt             chat messages whose instructions teach the hermes <tool_call> format the parser reads
  agent_name         searchrl_tool_agent (TrainSettings.agent_loop): verl's multi-turn tool loop, recording what
                     the server generated (trainer/plugins/agent_loop.py)
                     this row
  reward_model       {"style": "rule", "ground_truth": {"target": [answers]}}
  extra_info         split, index, and tools_kwargs["search"]["create_kwargs"] for the tool
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from searchrl.errors import DataError
from searchrl.prompt import PROMPT_VERSION, TOOL_NAME, build_messages
from searchrl.trainer.settings import DATASET_SIZES, TrainSettings

log = logging.getLogger(__name__)

HF_REPO_TYPE = "dataset"
AGENT_NAME = "searchrl_tool_agent"  # trainer/plugins/agent_loop.py (registered in every Ray process)
ABILITY = "fact-reasoning"
_SUFFIXES = (".parquet", ".jsonl", ".json")


@dataclass(frozen=True)
class PreparedData:
    train_file: Path
    test_file: Path
    train_rows: int
    test_rows: int
    reused: bool = False  # True when matching files from an earlier run were kept


@dataclass(frozen=True)
class SplitRow:
    """One verl row read back from a split this module wrote: what the loop is asked and scored against."""

    question: str
    answers: list[str]  # reward_model.ground_truth's targets
    prompt: list[dict[str, Any]]  # the chat messages verl's dataset feeds the agent loop


def data_source_name(raw: Any) -> str:
    """`nq` -> `searchR1_nq`; an already prefixed name is kept."""
    name = str(raw).strip()
    if not name:
        raise ValueError("empty data_source")
    return name if name.startswith("searchR1_") else f"searchR1_{name}"


def _is_missing(value: Any) -> bool:
    """None or a scalar NaN (pandas fills absent JSONL keys with NaN)."""
    return value is None or (isinstance(value, float) and value != value)


def _answers(raw: Any) -> list[str]:
    if _is_missing(raw):
        return []
    if isinstance(raw, str):
        return [raw] if raw.strip() else []
    if isinstance(raw, Mapping):  # an already converted reward_model.ground_truth
        return _answers(raw.get("target"))
    return [str(a) for a in list(raw) if str(a).strip()]


def to_verl_row(
    record: Mapping[str, Any], *, split: str, index: int, agent_name: str = AGENT_NAME
) -> dict[str, Any]:
    """One Search-R1 QA record (question, golden_answers, data_source) as a verl row."""
    raw_question = record.get("question")
    question = "" if _is_missing(raw_question) else str(raw_question).strip()
    if not question:
        raise ValueError("missing question")
    answers = _answers(record.get("golden_answers"))
    if not answers:
        raise ValueError("missing golden_answers")
    if _is_missing(record.get("data_source")):
        raise ValueError("missing data_source")
    source = data_source_name(record["data_source"])
    return {
        "data_source": source,
        "prompt": build_messages(question),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "agent_name": agent_name,
        "extra_info": {
            "split": split,
            "index": index,
            "question": question,
            "prompt_version": PROMPT_VERSION,
            "need_tools_kwargs": True,
            # create_kwargs reach SearchTool.create(); they must not be empty (parquet cannot store an empty struct).
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"question": question, "data_source": source}}},
        },
    }


def _read_table(path: Path) -> list[dict[str, Any]]:
    import pandas as pd

    try:
        if path.suffix == ".parquet":
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_json(path, lines=path.suffix == ".jsonl")
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read QA file {path}: {exc}") from exc
    missing = {"question", "golden_answers", "data_source"} - set(frame.columns)
    if missing:
        raise DataError(
            f"{path} lacks column(s) {sorted(missing)}: QA files need question, golden_answers, data_source"
        )
    records: list[dict[str, Any]] = frame.to_dict(orient="records")
    return records


def _find_split(folder: Path, split: str) -> Path | None:
    for suffix in _SUFFIXES:
        candidate = folder / f"{split}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def _download(repo_id: str, split: str) -> Path:
    """The HF dataset's `<split>.parquet` via huggingface_hub (cached under HF_HOME)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=f"{split}.parquet", repo_type=HF_REPO_TYPE))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise DataError(
            f"cannot download {split}.parquet of dataset {repo_id!r} ({type(exc).__name__}); check the network "
            "or HF_TOKEN, or set SEARCHRL_TRAIN_QA_SOURCE to a local parquet/JSONL file"
        ) from exc


def held_out(rows: int) -> int:
    """How many rows of a single QA file become the test split: a sixth, at least one."""
    return max(1, rows // 6)


def load_qa(source: str, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, test) QA records from a local file, a local folder, or a HF dataset repo id."""
    path = Path(source).expanduser()
    if path.is_dir():
        train, test = _find_split(path, "train"), _find_split(path, "test")
        if train is None or test is None:
            raise DataError(f"{path} needs train.{{parquet,jsonl}} and test.{{parquet,jsonl}}")
        return _read_table(train), _read_table(test)
    if path.is_file():
        if path.suffix not in _SUFFIXES:
            raise DataError(f"{path}: QA files must be .parquet, .jsonl or .json")
        rows = _read_table(path)
        if len(rows) < 2:
            raise DataError(f"{path} has {len(rows)} row(s); need at least 2 to hold out a test split")
        # One file: hold out a seeded sixth (the small preset's 200/1,200 share) as the test split.
        order = np.random.default_rng(seed).permutation(len(rows))
        n_test = held_out(len(rows))
        return [rows[i] for i in order[n_test:]], [rows[i] for i in order[:n_test]]
    if path.suffix in _SUFFIXES:
        raise DataError(f"QA file {path} does not exist; set SEARCHRL_TRAIN_QA_SOURCE to an existing file")
    if source.count("/") == 1 and not source.startswith((".", "/", "~")):
        return _read_table(_download(source, "train")), _read_table(_download(source, "test"))
    raise DataError(
        f"QA source {source!r} is neither a file, a folder nor a HF dataset id (owner/name); "
        "set SEARCHRL_TRAIN_QA_SOURCE"
    )


def sample(rows: list[dict[str, Any]], n: int | None, seed: int) -> list[dict[str, Any]]:
    """A seeded subset of `n` rows in original order; all rows when n is None or too large."""
    if n is None or n >= len(rows):
        if n is not None:
            log.warning("asked for %d rows but the source has %d; using all", n, len(rows))
        return list(rows)
    picked = np.sort(np.random.default_rng(seed).choice(len(rows), size=n, replace=False))
    return [rows[i] for i in picked]


def convert(
    records: Iterable[dict[str, Any]], *, split: str, total: int | None = None, agent_name: str = AGENT_NAME
) -> list[dict[str, Any]]:
    """Records -> verl rows, with a progress bar; rows without question/answers/source are skipped and counted."""
    from tqdm import tqdm

    out: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    for record in tqdm(records, total=total, desc=f"verl rows ({split})", unit="row"):
        try:
            out.append(to_verl_row(record, split=split, index=len(out), agent_name=agent_name))
        except ValueError as exc:
            skipped[str(exc)] = skipped.get(str(exc), 0) + 1
    if skipped:
        log.warning("%s: skipped %d rows: %s", split, sum(skipped.values()), skipped)
    if not out:
        raise DataError(f"no usable {split} rows: every row lacked a question, golden_answers or data_source")
    return out


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    tmp.replace(path)  # atomic: a crash never leaves a half-written file that a later run would reuse


def read_split(path: Path) -> list[SplitRow]:
    """The rows of a split `prepare_data` wrote (train or test parquet), in file order: the order verl's dataset
    indexes them by, so a rollout dump's row index names its question here."""
    import pandas as pd

    rows: list[dict[str, Any]] = pd.read_parquet(path).to_dict(orient="records")
    return [
        SplitRow(
            question=str(row["extra_info"]["question"]),
            answers=_answers(row["reward_model"]["ground_truth"]),
            prompt=[dict(message) for message in row["prompt"]],
        )
        for row in rows
    ]


def train_questions(settings: TrainSettings) -> list[str]:
    """The run's train questions in file order (the questions the run samples)."""
    return [row.question for row in read_split(settings.train_file)]


def _meta(settings: TrainSettings) -> dict[str, Any]:
    return {
        "qa_source": settings.qa_source,
        "dataset_size": settings.dataset_size,
        "seed": settings.seed,
        "prompt_version": PROMPT_VERSION,
        "agent_name": settings.agent_loop,
    }


def prepare_data(settings: TrainSettings, *, force: bool = False) -> PreparedData:
    """Write train/test parquet for `settings.dataset_size`; reuse files made from the same inputs."""
    meta_path = settings.split_dir / "meta.json"
    wanted = _meta(settings)
    if not force and settings.train_file.is_file() and settings.test_file.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if {k: meta.get(k) for k in wanted} == wanted:
            log.info("reusing %s (same source, size, seed and prompt version)", settings.split_dir)
            return PreparedData(
                settings.train_file, settings.test_file, meta["train_rows"], meta["test_rows"], reused=True
            )
    n_train, n_test = DATASET_SIZES[settings.dataset_size]
    train_qa, test_qa = load_qa(settings.qa_source, settings.seed)
    agent = settings.agent_loop
    train_rows = convert(sample(train_qa, n_train, settings.seed), split="train", agent_name=agent)
    test_rows = convert(sample(test_qa, n_test, settings.seed + 1), split="test", agent_name=agent)
    _write_parquet(train_rows, settings.train_file)
    _write_parquet(test_rows, settings.test_file)
    meta_path.write_text(
        json.dumps({**wanted, "train_rows": len(train_rows), "test_rows": len(test_rows)}, indent=2)
    )
    log.info("wrote %d train and %d test rows to %s", len(train_rows), len(test_rows), settings.split_dir)
    return PreparedData(settings.train_file, settings.test_file, len(train_rows), len(test_rows))


__all__ = [
    "AGENT_NAME",
    "PreparedData",
    "SplitRow",
    "convert",
    "data_source_name",
    "held_out",
    "load_qa",
    "prepare_data",
    "read_split",
    "to_verl_row",
    "train_questions",
]
