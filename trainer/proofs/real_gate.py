"""The variance gate before `make learn-cpu-real` trains, and the greedy probe after: the policy's own turn, sampled
outside verl on the contexts training sees.

GRPO learns only from groups whose samples score differently: a 0/1 reward at base rate p varies in a group of 8
with probability 1 - p^8 - (1-p)^8, and a reward the model never earns gives no gradient at all (DESIGN.md 3d:
at 135M "writes its own tool call" and "answers in format" scored 0.000 in 80 samples). So before a run spends
half an hour, `gate` samples each train question `n` times at T = 1 with the run's per-turn token budget, scores
every turn with the run's reward (trainer/proofs/rewards.py), and refuses to train (one line, exit 2) when no group
varies. The same samples give the run its null: how far the mean reward of a second epoch lands from the first
when the policy does not change at all (`null_rise`), which the run's rise must beat.

A context is what the rollout's model turn sees: the data prep's prompt (searchrl/prompt.py), the scripted search
call, and the search tool's real response against the run's own service, built from the run's tool YAML as verl
builds it, rendered with the run's chat template (trainer/proofs/learn.py `probe_contexts` does the same for the tiny
model). The probe decodes greedily on held-out dev questions, before and after training: the share of turns that
say something without inventing a tool response.
"""

from __future__ import annotations

import json
import logging
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.errors import ConfigError
from searchrl.trainer.data import read_split
from searchrl.trainer.proofs.rewards import turn_score
from searchrl.trainer.settings import TrainSettings

log = logging.getLogger(__name__)

NULL_DRAWS = 2000
NULL_QUANTILE = 0.95
# What the run teaches: "own-turn" (stage 1, trainer/proofs/rewards.py: answer the real tool response without inventing
# one) or "query" (stage 2, trainer/proofs/real_query.py: close a scripted search-call opening with a query that finds
# the evidence)
STAGES = ("own-turn", "query")
# (question index, turn) -> the stage's reward for that turn
Scorer = Callable[[int, str], float]


@dataclass(frozen=True)
class GateResult:
    """Each question's scores (one group of `n` samples a question) and how long the sampling took."""

    scores: list[list[float]]
    seconds: float = 0.0
    tokens: int = 0
    questions: list[str] = field(default_factory=list)
    turns: list[list[str]] = field(default_factory=list)  # the sampled turns, per question
    stage: str = "own-turn"

    def to_json(self) -> str:
        """Every question's scores and turns (<out>/gate.json): what the summary line averages."""
        rows = [
            {"question": q, "scores": s, "turns": t}
            for q, s, t in zip(self.questions, self.scores, self.turns, strict=True)
        ]
        return json.dumps({"line": self.line(), "groups": rows}, indent=1, ensure_ascii=False)

    @property
    def mean(self) -> float:
        return statistics.fmean(s for group in self.scores for s in group) if self.scores else 0.0

    @property
    def varying(self) -> float:
        """Share of groups whose samples did not all score alike (the groups GRPO can learn from)."""
        return sum(len(set(g)) > 1 for g in self.scores) / len(self.scores) if self.scores else 0.0

    def line(self) -> str:
        found = [s for group in self.scores for s in group]
        retrieved = (
            f", query retrieves a golden answer {sum(s == 1.0 for s in found) / len(found):.3f}"
            if self.stage == "query" and found
            else ""
        )
        return (
            f"variance gate{'' if self.stage == 'own-turn' else f' ({self.stage})'}: {len(self.scores)} questions x {len(self.scores[0]) if self.scores else 0} samples, "
            f"reward mean {self.mean:.3f}, {self.varying:.0%} of groups vary, null rise (95th pct) "
            f"{null_rise(self.scores):.3f}{retrieved}; {self.tokens} tokens in {self.seconds:.0f} s"
        )


def check_gate(result: GateResult) -> None:
    """ConfigError (one line) when no group varies: every GRPO advantage would be 0 and the run could not learn."""
    if not result.scores:
        raise ConfigError("variance gate: no question was sampled (the train split is empty)")
    if result.varying == 0:
        raise ConfigError(
            f"variance gate: none of {len(result.scores)} groups varies (reward mean {result.mean:.3f}): every "
            "GRPO advantage would be 0, so the run cannot learn; not training (pick a reward the model sometimes "
            "earns, DESIGN.md 3d)"
        )


def null_rise(scores: Sequence[Sequence[float]], *, draws: int = NULL_DRAWS, seed: int = 0) -> float:
    """The 95th percentile of (epoch 2 mean - epoch 1 mean) when the policy never changes.

    Each draw gives every question two fresh groups of its size, resampled with replacement from the gate's
    samples of that question (the initial policy), and takes the difference of their means over all questions:
    the noise of a run's epoch-to-epoch comparison with the same questions and group sizes and no learning.
    """
    groups = [list(g) for g in scores if g]
    if not groups:
        return 0.0
    rng = random.Random(seed)
    diffs = []
    for _ in range(draws):
        first = [s for g in groups for s in rng.choices(g, k=len(g))]
        second = [s for g in groups for s in rng.choices(g, k=len(g))]
        diffs.append(statistics.fmean(second) - statistics.fmean(first))
    diffs.sort()
    return diffs[min(len(diffs) - 1, int(NULL_QUANTILE * len(diffs)))]


def load_tokenizer(model_dir: Path, chat_template: str) -> Any:
    """The model's tokenizer with the run's chat template in place (the repo's, unless `model`)."""
    from transformers import AutoTokenizer

    from searchrl.chat_template import prepare_chat_template

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prepare_chat_template(tokenizer, model=str(model_dir), choice=chat_template)
    tokenizer.padding_side = "left"
    return tokenizer


def query_contexts(tokenizer: Any, questions: Sequence[str]) -> list[list[int]]:
    """Stage 2's contexts: the prompt, the generation prompt, then the scripted opening of a search call."""
    from searchrl.prompt import build_messages
    from searchrl.trainer.proofs.real_query import OPENING
    from searchrl.trainer.proofs.turn_context import chat_ids

    opening = tokenizer.encode(OPENING, add_special_tokens=False)
    return [chat_ids(tokenizer, build_messages(question)) + opening for question in questions]


def stage_contexts(
    settings: TrainSettings, tokenizer: Any, questions: Sequence[str], stage: str
) -> list[list[int]]:
    """The token ids the model's scored turn follows, per question, for `stage`."""
    if stage == "query":
        return query_contexts(tokenizer, questions)
    return turn_contexts(settings, tokenizer, questions)


def stage_scorer(settings: TrainSettings, stage: str, golden: Sequence[Sequence[str]]) -> Scorer:
    """The stage's reward as a function of (question index, turn); `golden` per question (stage 2 only)."""
    if stage == "query":
        from searchrl.trainer.proofs.real_query import query_score

        url = settings.retrieval_urls[0]
        return lambda i, turn: query_score(turn, golden[i], url)[0]
    return lambda i, turn: turn_score(turn)


def turn_contexts(settings: TrainSettings, tokenizer: Any, questions: Sequence[str]) -> list[list[int]]:
    """The token ids the model's own turn follows, per question (module docstring)."""
    from searchrl.prompt import build_messages
    from searchrl.trainer.proofs.turn_context import search_responses, turn_context_ids

    observations = search_responses(settings, questions, "gate")
    return [
        turn_context_ids(tokenizer, build_messages(question), question, observation)
        for question, observation in zip(questions, observations, strict=True)
    ]


def sample_turns(
    model_dir: Path,
    tokenizer: Any,
    contexts: Sequence[list[int]],
    *,
    n: int,
    max_tokens: int,
    temperature: float,
    dtype: str = "float32",
    batch: int = 16,
    seed: int = 0,
) -> tuple[list[list[str]], int]:
    """`n` turns per context (T = `temperature`, 0 = greedy), decoded without special tokens; and the tokens made."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    model.eval()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    jobs = [(c, ids) for c, ids in enumerate(contexts) for _ in range(n)]
    turns: list[list[str]] = [[] for _ in contexts]
    made = 0
    for start in range(0, len(jobs), batch):
        chunk = jobs[start : start + batch]
        width = max(len(ids) for _, ids in chunk)
        input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, (_, ids) in enumerate(chunk):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        sample = temperature > 0
        with torch.no_grad():
            out = model.generate(
                input_ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                do_sample=sample,
                temperature=temperature if sample else None,
                top_p=1.0 if sample else None,
                top_k=None,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        for row, (c, _) in enumerate(chunk):
            new = out[row, width:].tolist()
            kept = new[: new.index(eos) + 1] if eos in new else new
            made += len(kept)
            turns[c].append(tokenizer.decode(kept, skip_special_tokens=True))
        # minutes of CPU work: say how far it got (issue 39 item 10)
        log.info("sampled %d of %d turns (%d tokens so far)", start + len(chunk), len(jobs), made)
    return turns, made


def gate(
    settings: TrainSettings,
    model_dir: Path,
    *,
    n: int = 8,
    max_tokens: int = 96,
    dtype: str = "float32",
    chat_template: str = "searchrl",
    seed: int = 0,
    stage: str = "own-turn",
) -> GateResult:
    """Sample every train question `n` times at T = 1 and score each turn (the data and tool YAML must exist)."""
    import time

    tokenizer = load_tokenizer(model_dir, chat_template)
    rows = read_split(settings.train_file)
    questions = [row.question for row in rows]
    contexts = stage_contexts(settings, tokenizer, questions, stage)
    score = stage_scorer(settings, stage, [row.answers for row in rows] if stage == "query" else [])
    started = time.monotonic()
    turns, tokens = sample_turns(
        model_dir, tokenizer, contexts, n=n, max_tokens=max_tokens, temperature=1.0, dtype=dtype, seed=seed
    )
    scores = [[score(i, t) for t in group] for i, group in enumerate(turns)]
    return GateResult(
        scores=scores,
        seconds=time.monotonic() - started,
        tokens=tokens,
        questions=questions,
        turns=turns,
        stage=stage,
    )


def greedy_share(
    model_dir: Path,
    tokenizer: Any,
    contexts: Sequence[list[int]],
    *,
    max_tokens: int,
    dtype: str = "float32",
    scorer: Scorer | None = None,
) -> tuple[float, list[str]]:
    """Mean score of the greedy turns (stage 1: the share that say something without inventing a tool response;
    `scorer` gives another stage's), and the turns themselves."""
    turns, _ = sample_turns(
        model_dir, tokenizer, contexts, n=1, max_tokens=max_tokens, temperature=0.0, dtype=dtype
    )
    flat = [group[0] for group in turns]
    score = scorer or (lambda i, turn: turn_score(turn))
    return (statistics.fmean(score(i, t) for i, t in enumerate(flat)) if flat else 0.0), flat


__all__ = [
    "STAGES",
    "GateResult",
    "Scorer",
    "check_gate",
    "gate",
    "greedy_share",
    "load_tokenizer",
    "null_rise",
    "query_contexts",
    "sample_turns",
    "stage_contexts",
    "stage_scorer",
    "turn_contexts",
]
