"""`make learn-search` / `searchrl train learn-search`: a real model learns to SEARCH on a laptop (issue 52 item 3).

SmolLM2-135M-Instruct, GRPO through verl 0.9.1's own loop with verl's vLLM server as the rollout engine (the CPU
build, trainer/proofs/train_cpu_vllm.py's overrides, environment and clean-up), our search tool against the
bundled corpus' BM25 service, and Search-R1's exact match of the final `<answer>` as the whole reward (the
production reward, trainer/plugins/reward.py: `score` = EM, no format term). The run:

1. **Precision** by measurement (trainer/cpu/precision.py): bf16 where the CPU has it natively and a timed step
   is faster, else fp32; actor, reference and rollout alike.
2. **Questions** (trainer/proofs/search_questions.py): reverse look-ups over the corpus built without an LLM,
   kept only where their own text retrieves their passage in BM25's top 3; a held-out split written to
   `<out>/questions/held_out.jsonl` and never trained on. The 30 dev questions are a second held-out set.
3. **Base eval**: `searchrl eval` of the base model on the held-out questions with search on and off, and on
   the dev set with search (trainer/proofs/search_eval.py: vLLM's OpenAI server behind the environment's proxy).
4. **Train**: `steps` GRPO steps of `prompts` questions x `SAMPLES` samples, one on-policy Adam step each, no
   KL, entropy or warm-up, in the declared environment (trainer/proofs/search_env.py: the first turn opens a
   search call, the turn after the tool response opens `<answer>`; both as loss-mask-0 environment,
   trainer/proofs/search_agent_loop.py). Each step passes the CPU runs' checks as it arrives (weight fingerprint
   at every sync, loss mask, verl's sync bound for the precision).
5. **Trained eval**: the merged model, as in 3. With `null`, a second run with each step's rewards permuted
   among its trajectories (trainer/cpu/sabotage.py `shuffle_rewards`, same seed), merged and evaluated too.
6. **Report**: `searchrl compare` (Markdown and HTML, Wilson intervals, McNemar against the base model with
   search) in `<out>/report/`, the verdict (trainer/proofs/search_verdict.py) and its table in `<out>/summary.md`,
   the reward curve (`reward_curve.png`), per-question changes (`per_question.md`) and sample trajectories
   (`samples.md`). The last line says `learned to search` (exit 0) or what was measured (exit 2).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchrl.errors import ConfigError, SmokeCheckError
from searchrl.trainer.plugins.engine_kwargs import SEARCHRL_KWARGS
from searchrl.trainer.proofs.harness import fresh_out_dir
from searchrl.trainer.proofs.record import write_record
from searchrl.trainer.proofs.search_eval import Rules
from searchrl.trainer.proofs.search_verdict import Arm, Paired, Verdict, judge, paired, table

if TYPE_CHECKING:
    from searchrl.trainer.proofs.search_questions import QuestionSet
    from searchrl.trainer.proofs.train_cpu_vllm import Leftovers
    from searchrl.trainer.settings import TrainSettings
    from searchrl.trainer.step_checks import StepRow

log = logging.getLogger(__name__)

EXPERIMENT = "learn-search"
NULL_EXPERIMENT = "learn-search-null"
SAMPLES = 8  # GRPO group size
PROMPTS = 4  # questions a step
# The defaults are run 12's recipe (docs/cpu-proofs.md): each came from a run that failed without it.
STEPS = 8
LR = 1e-4
TURN_TOKENS = 96  # new tokens a model turn may write, a query or an answer (48 cut run 8's copied queries)
FORMAT_TERM = "written+f1"  # search_reward.FORMAT_TERMS (run 8 onwards; runs 2 to 7 tried the others)
CLOSE_ANSWER = True  # the environment ends the answer at its first line (run 3 onwards)
CLOSE_QUERY = True  # the environment ends the query at its closing quote (run 10: run 9 broke its calls)
# new tokens the answer turn may write, with CLOSE_ANSWER (run 12: run 11's answers held the title inside the
# passage's first sentence, EM 0 of 60; a copier of that sentence scores 10 of 60 held-out at this cap)
ANSWER_TOKENS = 4
TRAIN_QUESTIONS = 240  # data prep keeps five sixths for training (trainer/data.py held_out)
HELD_OUT = 60
TOPK = 3
PASSAGE_CHARS = 200
MAX_TURNS = 1  # one search, then the answer (Search-R1 counts tool turns)
RESPONSE_TOKENS = (
    512  # both openings, the query, 3 passages (~280 tokens), the answer, at a 48-token turn cap
)


def response_tokens(turn_tokens: int) -> int:
    """The trajectory's token budget for a turn cap (`--turn-tokens`): RESPONSE_TOKENS at a 48-token cap, and room
    for both model turns (query and answer) to grow with the cap (608 at the default 96)."""
    return RESPONSE_TOKENS + 2 * max(0, turn_tokens - 48)


KV_CACHE_BYTES = 2**30  # SmolLM2-135M in bf16: ~23 KB a token (30 layers x K,V x 3 heads x 64), ~46k tokens
# The declared format term (trainer/proofs/search_reward.py): 0.2 for an episode whose own search call parsed and ran.
# Why: under EM alone the base policy scores 0 in every sample (measured 2026-12-07, T=1, 12 questions x 8: calls
# closed 0.26, answer retrieved 0.03, answer closed 0.01, EM 0.000; 0 of 12 GRPO groups vary), so GRPO has no
# gradient; the closed call varies in ~90% of groups. Its share of the reward is reported (`format_share`).
FORMAT_WEIGHT = 0.2
TERM_TEXT = {
    "searched": "its own search call ran",
    "retrieved": "its own search retrieved a golden answer",
    "retrieved+f1": "half: its own search retrieved a golden answer; half: the answer's token F1",
    "query+f1": "half: the share of the question's content words in its first query; half: the answer's token F1",
    "query+searched+f1": "a third each: the question's content words in the query it wrote; a call that ran; the "
    "answer's token F1",
    "written+f1": "half: the question's content words in the query it wrote (in full when the call ran, half when "
    "not); half: the answer's token F1",
}
# Adam's first-moment decay. verl's default 0.9 keeps stepping after a gradient: on a step where every GRPO group
# scored alike (no advantage, gradient exactly 0) the update is still 0.9^k x an earlier one (bias-corrected: about
# 0.67, 0.52, 0.42 of the first step's size on the next three), so runs 4 and 5, where most steps had no rewarded
# trajectory, kept moving the policy on steps without signal (docs/cpu-proofs.md). With 0, and no weight decay, a
# step without signal is a no-op; verl's config takes betas and weight_decay as they are (optim.betas, .weight_decay).
ADAM_BETA1 = 0.0
REWARD_PATH = "pkg://searchrl.trainer.proofs.search_reward"
AGENT_MODULE = "searchrl.trainer.proofs.search_agent_loop"
ROLLOUTS = "rollouts"
BASE, TRAINED, NULL = "base", "trained", "null"


@dataclass
class LearnSearchRun:
    """What one run did and measured."""

    out_dir: Path
    model_dir: Path
    dtype: str = "float32"
    dtype_reason: str = ""
    format_weight: float = FORMAT_WEIGHT
    format_term: str = FORMAT_TERM  # search_reward.FORMAT_TERMS: what the format term pays for
    close_answer: bool = (
        CLOSE_ANSWER  # the environment ends the answer turn at a newline or `<` and closes it
    )
    close_query: bool = (
        CLOSE_QUERY  # the environment ends the query turn at its closing quote and closes the call
    )
    turn_tokens: int = TURN_TOKENS  # new tokens a model turn may write
    answer_tokens: int | None = None  # new tokens the answer turn may write (None: the turn cap)
    # held-out EM of a policy that answers with its passage's first sentence, cut as the environment cuts it
    # (search_questions.copied_openings): what the answer cap alone gives a perfect copier
    copier_em: float = math.nan
    adam_beta1: float = ADAM_BETA1  # 0.9 is verl's default (runs 1 to 5)
    format_share: float = math.nan  # the format term's share of the run's summed reward (rollout dumps)
    questions: QuestionSet | None = None
    rows: list[StepRow] = field(default_factory=list)
    null_rows: list[StepRow] = field(default_factory=list)
    results: dict[str, Path] = field(default_factory=dict)  # eval label -> result JSON
    arms: dict[str, Arm] = field(default_factory=dict)
    # held-out arm (search on) -> per question: would its written query's top-k hold a golden answer
    # (trainer/proofs/written_queries.py: the query's quality, whether or not its call parsed)
    written: dict[str, list[bool]] = field(default_factory=dict)
    dev: dict[str, Arm] = field(default_factory=dict)
    verdict: Verdict | None = None
    phases: dict[str, float] = field(default_factory=dict)
    checks: str = ""
    compare_table: str = ""
    stopped: str = ""  # the error that stopped the run before its verdict

    def line(self) -> str:
        if self.verdict is not None:
            return self.verdict.line()
        return f"did NOT learn to search: no verdict: {self.stopped or 'the run never judged'}"

    def figures(self) -> dict[str, Any]:
        """What `<out>/run.json` holds (trainer/proofs/record.py): per arm n, EM, answer retrieval and searches per
        episode; the paired differences; each step's mean reward; the format term's share; the phase times."""

        def arms(group: dict[str, Arm]) -> dict[str, dict[str, float]]:
            return {
                key: {
                    "n": a.n,
                    "em": a.mean(),
                    "retrieved": a.found_share(),
                    "searches": a.searches_mean(),
                    "f1": a.f1_mean(),
                    "covers": a.cover_share(),
                }
                for key, a in group.items()
            }

        def pair(p: Paired | None) -> dict[str, float] | None:
            return None if p is None else asdict(p)

        verdict = self.verdict
        return {
            "held_out": arms(self.arms),
            "written_query_would_retrieve": {
                key: {"n": len(found), "share": sum(found) / len(found) if found else None}
                for key, found in self.written.items()
            },
            "dev": arms(self.dev),
            "paired": None
            if verdict is None
            else {
                "em": pair(verdict.em),
                "retrieved": pair(verdict.found),
                "on_vs_off": pair(verdict.on_vs_off),
                "null": pair(verdict.null),
                "gain_on": verdict.gain_on,
                "gain_off": verdict.gain_off,
            },
            "step_reward": [row.get("reward") for row in self.rows],
            "null_step_reward": [row.get("reward") for row in self.null_rows],
            "format_term": self.format_term,
            "format_weight": self.format_weight,
            "format_share": self.format_share,
            "close_answer": self.close_answer,
            "close_query": self.close_query,
            "adam_beta1": self.adam_beta1,
            "turn_tokens": self.turn_tokens,
            "answer_tokens": self.answer_tokens,
            "copier_em": self.copier_em,
            "phases_s": self.phases,
        }

    def written_lines(self) -> list[str]:
        """The written-query measure per arm, and trained - base paired, as report lines ([] before it ran)."""
        from searchrl.stats import wilson_ci

        if not self.written:
            return []
        lines = [
            f"its own first query, read to its closing quote whether or not the call parsed, would put a golden "
            f"answer in BM25's top {TOPK} (query formulation alone):"
        ]
        for key, found in self.written.items():
            low, high = wilson_ci(sum(found), len(found))
            lines.append(f"- {key}: {sum(found)}/{len(found)} [{low:.3f}, {high:.3f}]")
        base, trained = (self.written.get(f"{who}, held, search on") for who in (BASE, TRAINED))
        if base and trained:
            lines.append(f"- trained - base, paired: {paired(base, trained).text()}")
        return lines

    def report(self) -> str:
        steps = [
            "| run | step | mean reward (EM + format term) | model-written searches | response length | entropy | wall s |",
            "|---|---|---|---|---|---|---|",
        ]
        from searchrl.trainer.step_checks import ENTROPY

        for label, rows in ((TRAINED, self.rows), (NULL, self.null_rows)):
            for row in rows:
                steps.append(
                    f"| {label} | {row.step} | {row.get('reward'):.3f} | {row.get('search_calls'):.0f} | "
                    f"{row.get('response_length'):.1f} | {row.metrics.get(ENTROPY, math.nan):.3f} | "
                    f"{row.get('wall_s'):.1f} |"
                )
        verdict = self.verdict
        extra = []
        if verdict is not None:
            extra = [
                f"paired on held-out questions: EM with search trained - base {verdict.em.text()}; answer "
                f"retrieved {verdict.found.text()}; trained with search - without {verdict.on_vs_off.text()}; "
                f"EM gain with search on {verdict.gain_on:+.3f}, off {verdict.gain_off:+.3f}"
                + (
                    f"; trained - shuffled-reward null {verdict.null.text()}"
                    if verdict.null
                    else "; null not run"
                ),
            ]
        return "\n".join(
            [
                f"model {self.model_dir}, {self.dtype}: {self.dtype_reason}",
                f"reward: Search-R1 EM + {self.format_weight:g} x [{TERM_TEXT[self.format_term]}] (declared format "
                "term); "
                f"the format term's share of the run's summed reward: {self.format_share:.3f}; environment closes the "
                f"answer: {self.close_answer}, the query: {self.close_query}; Adam beta1 {self.adam_beta1:g}; turn cap {self.turn_tokens} tokens"
                + (f", the answer's {self.answer_tokens}" if self.answer_tokens else "")
                + f"; held-out EM of a copier of its passage's first sentence under these caps: {self.copier_em:.3f}",
                self.questions.line() if self.questions else "questions: not built",
                "",
                "held-out questions (never trained on):",
                table(list(self.arms.values())) if self.arms else "(no eval)",
                "",
                "dev set (30 questions, a second held-out set):",
                table(list(self.dev.values())) if self.dev else "(no eval)",
                "",
                *extra,
                *self.written_lines(),
                "",
                *steps,
                "",
                "phase times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in self.phases.items()),
                *([self.checks] if self.checks else []),
                self.line(),
            ]
        )


def search_settings(
    out_dir: Path,
    model_dir: Path,
    url: str,
    *,
    experiment: str,
    steps: int,
    prompts: int,
    lr: float,
    seed: int,
    prompt_tokens: int,
    turn_tokens: int = TURN_TOKENS,
) -> TrainSettings:
    """The CPU runs' settings with the run's model, environment, batch and lengths (module docstring, step 4)."""
    from searchrl.trainer.proofs.harness import cpu_settings
    from searchrl.trainer.proofs.search_agent_loop import AGENT_NAME

    return cpu_settings(out_dir, model_dir, url, steps=steps).with_changes(
        **{
            "experiment_name": experiment,
            "qa_source": str(out_dir / "questions" / "train.jsonl"),
            "chat_template": "searchrl",
            "agent_loop": AGENT_NAME,
            "seed": seed,
            "train_batch_size": prompts,
            "ppo_mini_batch_size": prompts,  # one on-policy Adam step a step
            "micro_batch_size_per_gpu": SAMPLES,
            "rollout_n": SAMPLES,
            "save_freq": steps,
            "max_turns": MAX_TURNS,
            "max_prompt_length": prompt_tokens,
            "max_response_length": response_tokens(turn_tokens),
            "topk": TOPK,
            "passage_max_chars": PASSAGE_CHARS,
            "lr": lr,
            "lr_warmup_ratio": 0.0,
            "kl_coef": 0.0,
            "entropy_coeff": 0.0,
        }
    )


def search_overrides(
    settings: TrainSettings, run: LearnSearchRun, seed: int, rollout_dir: Path, ray_temp: Path
) -> list[str]:
    """The CPU overrides, the vLLM server's (with the run's precision and batch), the agent loop's plugin, a
    seeded rollout, the per-turn budget and verl's per-step trajectory dumps; the reward, environment and
    optimiser knobs are `run`'s (format weight and term, closed turns, turn and answer caps, Adam's beta1)."""
    from searchrl.trainer.overrides import VLLM_SYNC_KEY, hydra_value, merge_overrides
    from searchrl.trainer.proofs.harness import cpu_overrides
    from searchrl.trainer.proofs.real import precision_overrides
    from searchrl.trainer.proofs.search_env import ANSWER_TOKENS_KEY, CLOSE_ANSWER_KEY, CLOSE_QUERY_KEY
    from searchrl.trainer.proofs.train_cpu_vllm import PLUGINS, vllm_cpu_overrides

    pairs: list[tuple[str, object]] = [
        (VLLM_SYNC_KEY, ",".join([*PLUGINS, AGENT_MODULE])),
        ("actor_rollout_ref.rollout.dtype", run.dtype),
        ("actor_rollout_ref.rollout.max_num_seqs", settings.train_batch_size * SAMPLES),
        ("actor_rollout_ref.rollout.max_num_batched_tokens", 8192),
        ("actor_rollout_ref.rollout.seed", seed),
        (f"+{SEARCHRL_KWARGS}.turn_max_tokens", run.turn_tokens),
        ("trainer.rollout_data_dir", str(rollout_dir)),
        ("reward.custom_reward_function.path", REWARD_PATH),
        ("reward.custom_reward_function.name", "compute_score"),
        ("+reward.custom_reward_function.reward_kwargs.format_weight", run.format_weight),
        ("+reward.custom_reward_function.reward_kwargs.format_term", run.format_term),
        (f"+{SEARCHRL_KWARGS}.{CLOSE_ANSWER_KEY}", run.close_answer),
        (f"+{SEARCHRL_KWARGS}.{CLOSE_QUERY_KEY}", run.close_query),
        ("actor_rollout_ref.actor.optim.betas", [run.adam_beta1, 0.999]),
        ("actor_rollout_ref.actor.optim.weight_decay", 0.0 if run.adam_beta1 == 0 else 0.01),
        *([(f"+{SEARCHRL_KWARGS}.{ANSWER_TOKENS_KEY}", run.answer_tokens)] if run.answer_tokens else []),
    ]
    base = merge_overrides(cpu_overrides(scripted_first_turn=False), precision_overrides(run.dtype))
    base = merge_overrides(base, vllm_cpu_overrides(settings, ray_temp, KV_CACHE_BYTES))
    return merge_overrides(base, [f"{key}={hydra_value(value)}" for key, value in pairs])


def prompt_tokens(model_dir: Path, questions: Sequence[str]) -> int:
    """verl's max prompt length for these questions: the longest rendered prompt, rounded up to 64."""
    from searchrl.prompt import build_messages
    from searchrl.trainer.proofs.real_gate import load_tokenizer
    from searchrl.trainer.proofs.turn_context import chat_ids

    tokenizer = load_tokenizer(model_dir, "searchrl")
    longest = max(len(chat_ids(tokenizer, build_messages(q))) for q in questions)
    return -(-(longest + 8) // 64) * 64


def check_args(
    model_dir: Path, corpus: Path, *, steps: int, prompts: int, lr: float, train: int, held: int
) -> None:
    """Refuse bad input with one line (ConfigError, exit 2) before anything starts."""
    from searchrl.trainer.proofs.train_cpu_vllm import check_rollout

    if not (model_dir / "config.json").is_file():
        raise ConfigError(
            f"{model_dir} is not a Hugging Face model folder (no config.json): run `searchrl model get smollm2-135m` "
            "or pass --model with a local folder"
        )
    if not corpus.is_file():
        raise ConfigError(f"corpus {corpus} does not exist: pass --corpus with a Search-R1 JSONL")
    if steps < 1 or prompts < 1 or not lr > 0 or train < 6 or held < 10:
        raise ConfigError(
            f"--steps {steps}, --prompts {prompts}, --lr {lr}, --train-questions {train}, --held-out {held}: steps and "
            "prompts at least 1, lr above 0, at least 6 train and 10 held-out questions"
        )
    if steps * prompts > train - train // 6:
        raise ConfigError(
            f"--steps {steps} x --prompts {prompts} needs more than the {train - train // 6} training rows data prep "
            "keeps: every step must train on questions not seen before (raise --train-questions)"
        )
    check_rollout("vllm", "sync")


def answer_cap(answer_tokens: int | None, close_answer: bool, turn_tokens: int) -> int | None:
    """The answer turn's cap a run declares: `--answer-tokens` as given (0: none), or by default ANSWER_TOKENS when
    the environment closes the answer and none when it does not (a cut answer left open parses as no answer)."""
    if answer_tokens is None:
        answer_tokens = ANSWER_TOKENS if close_answer else 0
    if answer_tokens and not (close_answer and 1 <= answer_tokens <= turn_tokens):
        raise ConfigError(
            f"--answer-tokens {answer_tokens}: between 1 and --turn-tokens ({turn_tokens}), with --close-answer (the "
            "environment closes the cut answer); 0 turns the cap off"
        )
    return answer_tokens or None


def run_learn_search(
    out_dir: Path,
    model_dir: Path,
    *,
    corpus: Path,
    steps: int = STEPS,
    prompts: int = PROMPTS,
    lr: float = LR,
    train_questions: int = TRAIN_QUESTIONS,
    held_out: int = HELD_OUT,
    precision: str = "auto",
    seed: int = 0,
    null: bool = False,
    timeout_s: float = 3600.0,
    format_weight: float = FORMAT_WEIGHT,
    close_answer: bool = CLOSE_ANSWER,
    format_term: str = FORMAT_TERM,
    adam_beta1: float = ADAM_BETA1,
    turn_tokens: int = TURN_TOKENS,
    close_query: bool = CLOSE_QUERY,
    answer_tokens: int | None = None,
) -> LearnSearchRun:
    """The whole run (module docstring); the verdict is on the returned run."""
    from searchrl.trainer.proofs.train_cpu_vllm import Leftovers

    model_dir = model_dir.expanduser().resolve()
    check_args(model_dir, corpus, steps=steps, prompts=prompts, lr=lr, train=train_questions, held=held_out)
    out_dir = fresh_out_dir(out_dir)
    if not 0 <= format_weight < 1:
        raise ConfigError(
            f"--format-weight {format_weight}: between 0 (EM alone) and below 1 (EM's own weight)"
        )
    from searchrl.trainer.proofs.search_reward import FORMAT_TERMS

    if format_term not in FORMAT_TERMS:
        raise ConfigError(f"--format-term {format_term!r}: one of {', '.join(FORMAT_TERMS)}")
    if not 0 <= adam_beta1 < 1:
        raise ConfigError(f"--adam-beta1 {adam_beta1}: at least 0 and below 1 (verl's default is 0.9)")
    if not 8 <= turn_tokens <= 256:
        raise ConfigError(f"--turn-tokens {turn_tokens}: between 8 and 256 (default {TURN_TOKENS})")
    answer_tokens = answer_cap(answer_tokens, close_answer, turn_tokens)
    run = LearnSearchRun(
        out_dir,
        model_dir,
        format_weight=format_weight,
        close_answer=close_answer,
        close_query=close_query,
        format_term=format_term,
        adam_beta1=adam_beta1,
        turn_tokens=turn_tokens,
        answer_tokens=answer_tokens,
    )
    leftovers = Leftovers.start()
    try:
        _run(
            run,
            leftovers,
            corpus,
            steps,
            prompts,
            lr,
            train_questions,
            held_out,
            precision,
            seed,
            null,
            timeout_s,
        )
    except BaseException as exc:  # SIGTERM too (a KeyboardInterrupt): the record says why the run stopped
        run.stopped = str(exc)
        raise
    finally:
        leftovers.clean()
        (out_dir / "summary.md").write_text(run.report() + "\n", encoding="utf-8")
        learned = run.verdict is not None and run.verdict.learned
        write_record(out_dir, "learn-search", None if learned else run.line(), run.figures())
    return run


def _phase(run: LearnSearchRun, name: str, started: float) -> None:
    run.phases[name] = time.monotonic() - started
    log.info("%s done in %.0f s", name, run.phases[name])


def _run(  # noqa: PLR0913  (run_learn_search's keywords, passed through once)
    run: LearnSearchRun,
    leftovers: Leftovers,
    corpus: Path,
    steps: int,
    prompts: int,
    lr: float,
    train_questions: int,
    held_out: int,
    precision: str,
    seed: int,
    null: bool,
    timeout_s: float,
) -> None:
    from searchrl.devset import dev_qa_path
    from searchrl.retrieval.process import served
    from searchrl.trainer.cpu.precision import choose_cpu_dtype
    from searchrl.trainer.launch import check_retrieval
    from searchrl.trainer.proofs.search_questions import build_questions, write_qa

    out = run.out_dir
    started = time.monotonic()
    run.dtype, run.dtype_reason = choose_cpu_dtype(run.model_dir, precision)
    log.info("precision %s", run.dtype_reason)
    _phase(run, "precision", started)
    with served(["--backend", "bm25"], out / "serve.log") as url:
        started = time.monotonic()
        _wait_retrieval(url)
        run.questions = build_questions(corpus, url, train=train_questions, held_out=held_out)
        held_qa = write_qa(out / "questions" / "held_out.jsonl", run.questions.held_out)
        write_qa(out / "questions" / "train.jsonl", run.questions.train)
        log.info("%s", run.questions.line())
        run.copier_em = copier_em(run, corpus)
        prompt_len = prompt_tokens(run.model_dir, [q.question for q in run.questions.train])
        settings = search_settings(
            out, run.model_dir, url, experiment=EXPERIMENT, steps=steps, prompts=prompts, lr=lr, seed=seed,
            prompt_tokens=prompt_len, turn_tokens=run.turn_tokens,
        )  # fmt: skip
        check_retrieval(settings)
        _phase(run, "questions", started)
        rules = Rules(MAX_TURNS, TOPK, PASSAGE_CHARS, run.turn_tokens, response_tokens(run.turn_tokens))
        sets = {"held": held_qa, "dev": dev_qa_path()}
        started = time.monotonic()
        _evaluate(run, BASE, run.model_dir, url, sets, rules, leftovers, search_off=True)
        _phase(run, "base eval", started)
        for experiment, label, sabotage in ((EXPERIMENT, TRAINED, None), *([(NULL_EXPERIMENT, NULL, "shuffle_rewards")] if null else [])):  # fmt: skip
            started = time.monotonic()
            merged = _train(
                run, settings.with_changes(experiment_name=experiment), seed, leftovers, timeout_s, sabotage
            )
            _phase(run, f"train {label}", started)
            plot_rewards(run, out / "reward_curve.png")
            started = time.monotonic()
            only_on = label == NULL
            _evaluate(
                run,
                label,
                merged,
                url,
                {"held": held_qa} if only_on else sets,
                rules,
                leftovers,
                search_off=not only_on,
            )
            _phase(run, f"{label} eval", started)
        _written(run, url, [q.question for q in run.questions.held_out])
    started = time.monotonic()
    _verdict_and_report(run)
    _phase(run, "report", started)


def copier_em(run: LearnSearchRun, corpus: Path) -> float:
    """`LearnSearchRun.copier_em` on the run's held-out questions, with the run's tokenizer and answer cap."""
    from searchrl.scoring import exact_match
    from searchrl.trainer.proofs.real_gate import load_tokenizer
    from searchrl.trainer.proofs.search_questions import copied_openings

    held = run.questions.held_out if run.questions else []
    if not held:
        return math.nan
    cap = run.answer_tokens or run.turn_tokens
    answers = copied_openings(corpus, held, load_tokenizer(run.model_dir, "searchrl"), cap)
    return sum(exact_match(a, [q.answer]) for a, q in zip(answers, held, strict=True)) / len(held)


def _wait_retrieval(url: str, timeout_s: float = 300.0) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/ready", timeout=2).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise SmokeCheckError(f"the BM25 service at {url} was not ready after {timeout_s:.0f} s")


def _train(
    run: LearnSearchRun,
    settings: TrainSettings,
    seed: int,
    leftovers: Leftovers,
    timeout_s: float,
    sabotage: str | None,
) -> Path:
    """One verl invocation (module docstring, step 4); the merged model's folder."""
    from searchrl.trainer.cpu import sabotage as sabotages
    from searchrl.trainer.merge import merge_latest
    from searchrl.trainer.proofs.harness import run_checks_line, run_training
    from searchrl.trainer.proofs.real import check_real_steps
    from searchrl.trainer.proofs.train_cpu_vllm import vllm_cpu_env

    name = settings.experiment_name
    rollout_dir = run.out_dir / f"{ROLLOUTS}-{name}"
    overrides = search_overrides(settings, run, seed, rollout_dir, leftovers.ray_temp_dir)
    env = vllm_cpu_env(leftovers.scratch)
    if sabotage is not None:
        env[sabotages.ENV] = sabotage
    rows, text = run_training(
        settings,
        overrides,
        run.out_dir / f"{name}.log",
        name,
        timeout_s,
        lambda row: check_real_steps([row], run.dtype, per_step=True),
        env,
    )
    problems = training_problems(rows, run.dtype, settings.total_steps)
    if problems:
        raise SmokeCheckError(f"{name} missed what training must show: " + "; ".join(problems))
    checks = run_checks_line(rows, [text], hf=False, mean_bound=run.dtype != "float32")
    if sabotage is None:
        run.rows, run.checks = rows, checks
        run.format_share = format_share(rollout_dir)
    else:
        run.null_rows = rows
    return merge_latest(settings.run_dir).target_dir


def training_problems(rows: Sequence[StepRow], dtype: str, steps: int) -> list[str]:
    """The CPU runs' step checks (trainer/proofs/real.py `check_real_steps`: every step once, sync bound, loss mask,
    no failed search), with a search call asked of step 1 only. Step 1 samples the base model, whose calls ran in 9
    to 10 of 32 trajectories in every run so far: none there means the tool is not wired. After it, a policy that
    stops searching is a result the run measures (the step table, searches per episode on held-out questions), not
    a broken run: runs 4 and 5 stopped there and their trained model was never evaluated."""
    from searchrl.trainer.proofs.real import check_real_steps
    from searchrl.trainer.step_checks import ALL_CALLS

    problems = check_real_steps(list(rows), dtype, steps=steps, searching=False)
    first = next((row for row in rows if row.step == 1), None)
    if first is not None and not first.metrics.get(ALL_CALLS, math.nan) > 0:
        problems.append(
            "step 1: no search call (the base model's calls ran in 9-10 of 32 trajectories before)"
        )
    return problems


def _evaluate(
    run: LearnSearchRun,
    label: str,
    model_dir: Path,
    retrieval_url: str,
    sets: dict[str, Path],
    rules: Rules,
    leftovers: Leftovers,
    *,
    search_off: bool,
) -> None:
    """`searchrl eval` of one model: each set with search on, the held-out set with search off too."""
    from searchrl.trainer.proofs.search_eval import run_eval, served_model

    results = run.out_dir / "results"
    with served_model(
        model_dir,
        f"smollm2-{label}",
        run.dtype,
        run.out_dir / "logs",
        leftovers.scratch,
        close_answer=run.close_answer,
        close_query=run.close_query,
        answer_tokens=run.answer_tokens,
    ) as llm:
        jobs = [(name, qa, True) for name, qa in sets.items()] + (
            [("held", sets["held"], False)] if search_off else []
        )
        for name, qa, search in jobs:
            key = f"{label}, {name}, search {'on' if search else 'off'}"
            run.results[key] = run_eval(
                llm_url=llm, name=f"smollm2-{label}", tokenizer=run.model_dir, retrieval_url=retrieval_url, qa=qa,
                label=key, search=search, rules=rules, out_dir=results / name, log_path=run.out_dir / "logs" / "eval.log",
            )  # fmt: skip


def _written(run: LearnSearchRun, retrieval_url: str, order: list[str]) -> None:
    """The written-query measure (trainer/proofs/written_queries.py) of every held-out arm with search on, while the
    run's service still serves."""
    from searchrl.trainer.proofs.search_eval import load_records
    from searchrl.trainer.proofs.written_queries import would_retrieve

    for key, result in run.results.items():
        if key.endswith(", held, search on"):
            records = load_records(result)
            run.written[key] = would_retrieve([records[q] for q in order], retrieval_url, TOPK)


def _arms(run: LearnSearchRun, name: str, order: list[str]) -> dict[str, Arm]:
    from searchrl.trainer.proofs.search_eval import load_records

    prefix_keys = [key for key in run.results if key.split(", ")[1] == name]
    return {key: Arm.from_records(key, load_records(run.results[key]), order) for key in prefix_keys}


def _verdict_and_report(run: LearnSearchRun) -> None:
    """The verdict on the held-out arms, `searchrl compare`'s report, per-question changes and samples."""
    from searchrl.trainer.proofs.search_eval import load_records, run_compare

    held = [q.question for q in run.questions.held_out] if run.questions else []
    run.arms = _arms(run, "held", held)
    first_dev = next((p for k, p in run.results.items() if ", dev," in k), None)
    if first_dev is not None:
        run.dev = _arms(run, "dev", list(load_records(first_dev)))

    def arm(label: str, search: str) -> Arm:
        return run.arms[f"{label}, held, search {search}"]

    null_key = f"{NULL}, held, search on"
    run.verdict = judge(
        arm(BASE, "on"), arm(TRAINED, "on"), arm(BASE, "off"), arm(TRAINED, "off"),
        run.arms.get(null_key),
    )  # fmt: skip
    held_results = [p for k, p in run.results.items() if ", held," in k]
    run.compare_table = run_compare(
        held_results,
        f"{BASE}, held, search on",
        run.out_dir / "report",
        "make learn-search: SmolLM2-135M, held-out reverse look-ups, base vs trained",
        run.out_dir / "logs" / "compare.log",
    )
    if run.dev:
        run_compare(
            [p for k, p in run.results.items() if ", dev," in k],
            f"{BASE}, dev, search on",
            run.out_dir / "report-dev",
            "make learn-search: SmolLM2-135M on the 30 dev questions",
            run.out_dir / "logs" / "compare-dev.log",
        )
    write_per_question(run, held)
    write_samples(run)


def format_share(rollout_dir: Path) -> float:
    """The format term's share of the summed reward over every trajectory verl dumped (score - em over score).

    verl 0.9.1's dump holds `input`, `output`, `gts`, `score`, `step` and `uid`, not the reward's `em`, so the EM
    part is scored again from `output` and `gts` by the reward's own scoring (searchrl/scoring.py
    `score_response`, the shaped EM the reward adds). Reading a missing `em` as 0 had reported a share of 1.000 for
    run 12, whose reward was mostly EM."""
    from searchrl.scoring import score_response
    from searchrl.trainer.plugins.reward import golden_answers

    scores = ems = 0.0
    for dump in rollout_dir.glob("*.jsonl"):
        for line in dump.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                scores += float(row.get("score") or 0.0)
                em = row.get("em")
                if em is None:
                    em = score_response(str(row.get("output") or ""), golden_answers(row.get("gts"))).em
                ems += float(em)
    return (scores - ems) / scores if scores else 0.0


def write_per_question(run: LearnSearchRun, order: list[str]) -> Path:
    """One row per held-out question: golden answer, base and trained answers, EM and retrieval each."""
    from searchrl.trainer.proofs.search_eval import load_records

    base = load_records(run.results[f"{BASE}, held, search on"])
    trained = load_records(run.results[f"{TRAINED}, held, search on"])
    lines = [
        "| question | golden | base answer | trained answer | EM base -> trained | retrieved base -> trained |",
        "|---|---|---|---|---|---|",
    ]
    for q in order:
        b, t = base[q], trained[q]
        lines.append(
            f"| {q[:90]} | {', '.join(b.get('golden_answers') or [])} | {b.get('answer')} | {t.get('answer')} | "
            f"{b.get('em', 0):.0f} -> {t.get('em', 0):.0f} | {int(bool(b.get('answer_in_observation')))} -> "
            f"{int(bool(t.get('answer_in_observation')))} |"
        )
    path = run.out_dir / "per_question.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_samples(run: LearnSearchRun, per_step: int = 2) -> Path:
    """The first `per_step` trajectories of the first and the last training step (verl's dumps), as text."""
    parts = []
    dumps = sorted((run.out_dir / f"{ROLLOUTS}-{EXPERIMENT}").glob("*.jsonl"), key=lambda p: int(p.stem))
    for dump in [*dumps[:1], *dumps[-1:]] if dumps else []:
        rows = [json.loads(line) for line in dump.read_text(encoding="utf-8").splitlines() if line.strip()]
        for row in rows[:per_step]:
            parts.append(
                f"## step {dump.stem}, score {row.get('score')}\n\n```\n{str(row.get('input', ''))[-300:]}"
                f"\n--- output ---\n{row.get('output', '')}\n```\n"
            )
    path = run.out_dir / "samples.md"
    path.write_text("\n".join(parts) or "no rollout dumps\n", encoding="utf-8")
    return path


def plot_rewards(run: LearnSearchRun, path: Path) -> Path:
    """Per-step mean reward (EM plus the declared format term, over the step's samples) of the run, and of the shuffled-reward null if it ran."""
    from searchrl.trainer.proofs.plots import pyplot, save, step_axis

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rows, style in ((TRAINED, run.rows, "-"), (NULL, run.null_rows, "--")):
        if rows:
            rewards = [row.get("reward") for row in rows]
            ax.plot(
                [row.step for row in rows],
                rewards,
                style,
                marker="o",
                label=f"{label} (mean {statistics.fmean(rewards):.3f})",
            )
    step_axis(ax, f"GRPO step ({PROMPTS} questions x {SAMPLES} samples, new questions each step)")
    ax.set_ylabel("mean reward (Search-R1 EM + the declared format term)")
    ax.set_title("make learn-search: SmolLM2-135M, reverse look-ups with search (2 CPU cores)", fontsize=10)
    ax.legend(fontsize=8)
    return save(fig, path)


__all__ = [
    "ANSWER_TOKENS",
    "EXPERIMENT",
    "HELD_OUT",
    "LR",
    "FORMAT_TERM",
    "PROMPTS",
    "STEPS",
    "TRAIN_QUESTIONS",
    "LearnSearchRun",
    "answer_cap",
    "check_args",
    "plot_rewards",
    "prompt_tokens",
    "run_learn_search",
    "search_overrides",
    "search_settings",
]
