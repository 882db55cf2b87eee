"""`make learn-cpu-real` / `searchrl train cpu --model smollm2-135m --learn`: real weights learn a search-agent
behaviour through verl's GRPO loop on CPU (issue 39 item 8).

SmolLM2-135M-Instruct, after a scripted search call and the bundled BM25 service's real top-3 response, often
writes a `<tool_response>` of its own, inventing the evidence (DESIGN.md 3d). The reward (trainer/proofs/rewards.py)
pays 1 for a non-empty own turn without one. The run:

1. **Gate** (trainer/proofs/real_gate.py): every train question sampled 8 times at T = 1 with the per-turn budget; the
   reward's mean and the share of groups that vary. No varying group: one line, exit 2, nothing trained. Its
   samples also give the null the reward's rise must beat (`null_rise`: two epochs of an unchanged policy).
2. **lr pilot** (when more than one lr is given): `pilot_steps` steps at each; the lr whose steps after the first
   (the first samples the initial policy) score the highest mean reward wins, the smaller on a tie.
3. **Run**: two epochs of the train split, 1 prompt x 8 samples a step, one on-policy Adam step each, no KL,
   entropy or warm-up, each model turn capped at `turn_tokens` new tokens (the agent loop puts `max_tokens` in
   the request, trainer/plugins/agent_loop.py), the scripted call as environment (loss mask 0). Each step passes the CPU
   runs' checks as it arrives (exact weight fingerprint, the loss mask, verl's mean sync bound in bf16).
4. **Probe**: greedy turns on held-out dev questions (not in the run's QA slice), initial vs merged model.

It passes when (a) the mean reward of the last epoch exceeds the gate's mean (the initial policy on the same
questions, before any update) by more than the gate's null; epoch 1 is no baseline with one prompt a step, since
it holds up to `epoch_steps - 1` updates (at lr 1e-4 every group scored 8/8 from step 3 on); (b) the invented
tool-response tokens per trajectory that trainer/plugins/masks.py counts from the tokens (`loss/model_tool_response_tokens`,
independent of the reward's text check) fall by at least `MIN_DROP` from epoch 1 to epoch 2; and (c) the greedy
probe's share of clean turns rises. Otherwise it fails with one line naming what missed, after writing its
curve (`reward_curve.png`) and table (`steps.md`): not learning is a result to read, not to hide. The report
(printed, and `steps.md`) ends with the line that says what the step checks read over the pilots and the run
(`step_checks.checks_line`); a check that never ran fails the run instead.

**Stage 2** (`--stage query`, trainer/proofs/real_query.py): the same gate, pilot, run and probe, but the loop scripts
the *opening* of a search call as environment (mask 0) where the model's first turn opens, the model writes the
query and closes the call, and the reward pays 0.5 for a well-formed call and 1.0 when its query's top-3 from the
run's BM25 service holds a golden answer. It passes on (a) and (c) (the probe's mean score on held-out questions);
(b) is stage 1's own behaviour and is not asked.

Precision follows trainer/cpu/precision.py (bf16 only where the CPU measures it faster); the weight fingerprint
is exact in either.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from searchrl.errors import ConfigError, SmokeCheckError
from searchrl.trainer.plugins.engine_kwargs import SEARCHRL_KWARGS
from searchrl.trainer.plugins.masks import MODEL_TOOL_RESPONSE_TOKENS
from searchrl.trainer.proofs.harness import fresh_out_dir
from searchrl.trainer.proofs.real_gate import GateResult
from searchrl.trainer.settings import TrainSettings
from searchrl.trainer.step_checks import ENTROPY, PROB_DIFF_MEAN, StepRow

log = logging.getLogger(__name__)

EXPERIMENT = "cpu-real-learn"
TURN_TOKENS = 96  # the own turn's budget: DESIGN.md 3d's gate measured the reward at this length
SAMPLES = 8  # one GRPO group a step
QUESTIONS = 12  # data prep keeps 10 of 12 for training: 10 steps an epoch
LRS = (1e-4,)  # one lr: no pilot; `--lrs 3e-5,1e-4` pilots each for PILOT_STEPS and keeps the better
PILOT_STEPS = 4
PROBE_QUESTIONS = 12  # held-out dev questions for the greedy probe (two models x 12 greedy turns)
MIN_DROP = 0.30  # invented tool-response tokens per trajectory, epoch 2 against epoch 1
TOPK = 3
PASSAGE_CHARS = 200
REWARD_FN_PATH = "pkg://searchrl.trainer.proofs.rewards"
REWARD_FN_NAME = "clean_turn_reward"
QUERY_REWARD_FN_PATH = "pkg://searchrl.trainer.proofs.real_query"
QUERY_REWARD_FN_NAME = "compute_score"


def invented_per_trajectory(row: StepRow) -> float:
    """Tokens inside `<tool_response>` text the model wrote itself, per trajectory of the step."""
    return row.metrics.get(MODEL_TOOL_RESPONSE_TOKENS, math.nan) / row.get("trajectories")


def epochs(rows: Sequence[StepRow], epoch_steps: int) -> tuple[list[StepRow], list[StepRow]]:
    """The first and the last whole epoch of the run's steps; ConfigError unless they are two whole epochs."""
    if epoch_steps < 1 or len(rows) != 2 * epoch_steps:
        raise ConfigError(
            f"{len(rows)} steps are not two whole epochs of {epoch_steps} train questions: the epochs compare "
            "the same questions only when each covers them all"
        )
    return list(rows[:epoch_steps]), list(rows[epoch_steps:])


def pick_lr(pilots: dict[float, list[StepRow]]) -> float:
    """The lr whose pilot steps after the first scored the highest mean reward (the smaller lr on a tie)."""
    if not pilots:
        raise ConfigError("no lr to pilot: pass --lrs with at least one value")

    def later(rows: list[StepRow]) -> float:
        rewards = [row.get("reward") for row in rows[1:]]
        return statistics.fmean(rewards) if rewards else -math.inf

    return max(sorted(pilots), key=lambda lr: (later(pilots[lr]), -lr))


@dataclass
class RealLearnRun:
    """What one real-weights learning run did and measured."""

    out_dir: Path
    model_dir: Path
    dtype: str = "float32"
    dtype_reason: str = ""
    gate: GateResult | None = None
    null: float = math.nan
    pilots: dict[float, list[StepRow]] = field(default_factory=dict)
    lr: float = math.nan
    epoch_steps: int = 0
    rows: list[StepRow] = field(default_factory=list)
    probe_initial: float = math.nan
    probe_merged: float = math.nan
    probe_questions: int = 0
    # distinct openings (first 5 words) among the greedy turns: a diagnostic, not a check; a policy that meets the
    # reward with one boilerplate turn for every question shows here (the first run's probe.json: 12 -> 2)
    probe_openings: tuple[int, int] = (0, 0)
    phases: dict[str, float] = field(default_factory=dict)
    stage: str = "own-turn"
    checks: str = ""  # step_checks.checks_line over the pilots and the run, set once they trained

    def ends(self) -> tuple[float, float, float, float, float]:
        """(reward before any update: the gate's mean, epoch 1, epoch 2; invented tokens a trajectory epoch 1, 2)."""
        first, last = epochs(self.rows, self.epoch_steps)
        return (
            self.gate.mean if self.gate is not None else math.nan,
            statistics.fmean(r.get("reward") for r in first),
            statistics.fmean(r.get("reward") for r in last),
            statistics.fmean(invented_per_trajectory(r) for r in first),
            statistics.fmean(invented_per_trajectory(r) for r in last),
        )

    def problems(self) -> list[str]:
        """The pass criteria of the module docstring that missed (empty: it learned)."""
        try:
            r0, _, r2, i1, i2 = self.ends()
        except ConfigError as exc:
            return [str(exc)]
        problems = []
        if not r2 - r0 > self.null:
            problems.append(
                f"reward did not rise beyond the null: {r0:.3f} before training -> {r2:.3f} in the last epoch "
                f"({r2 - r0:+.3f}, null {self.null:.3f})"
            )
        if self.stage == "query":
            pass  # stage 2 asks for the query, not for stage 1's behaviour (module docstring)
        elif not i1 > 0:
            problems.append(f"epoch 1 has no invented tool-response tokens to reduce ({i1:.1f} a trajectory)")
        elif not (i1 - i2) / i1 >= MIN_DROP:
            problems.append(
                f"invented tool-response tokens a trajectory fell {i1:.1f} -> {i2:.1f} "
                f"({(i2 - i1) / i1:+.0%}; needs -{MIN_DROP:.0%})"
            )
        if not self.probe_merged > self.probe_initial:
            problems.append(
                f"greedy probe did not rise: {self.probe_initial:.3f} -> {self.probe_merged:.3f} "
                f"({self.probe_questions} held-out questions)"
            )
        return problems

    def line(self) -> str:
        """The run's last line."""
        try:
            r0, r1, r2, i1, i2 = self.ends()
        except ConfigError:
            return f"learned nothing to compare: {len(self.rows)} steps"
        verdict = "learned" if not self.problems() else "did NOT learn"
        middle = (
            f"invented tool-response tokens a trajectory {i1:.1f} -> {i2:.1f}"
            if self.stage == "own-turn"
            else "stage query (close a scripted search-call opening; its query retrieves a golden answer)"
        )
        return (
            f"{verdict}: reward {r0:.3f} before -> {r2:.3f} last epoch ({r2 - r0:+.3f}, null {self.null:.3f}; "
            f"epoch 1 {r1:.3f}); {middle}; greedy probe "
            f"{self.probe_initial:.3f} -> {self.probe_merged:.3f}; lr {self.lr:g}, {self.dtype}, "
            f"{sum(self.phases.values()):.0f} s"
        )

    def table(self) -> str:
        """One row a step: reward, invented tokens a trajectory, length, entropy, grad norm, sync, wall."""
        lines = [
            "| run | step | mean reward | invented tool-response tokens / trajectory | response length | entropy "
            "| grad norm | sync mean prob diff | wall s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        runs = [(f"pilot lr {lr:g}", rows) for lr, rows in self.pilots.items()]
        for label, rows in [*runs, (f"run lr {self.lr:g}", self.rows)]:
            for row in rows:
                m = row.metrics
                lines.append(
                    f"| {label} | {row.step} | {row.get('reward'):.3f} | {invented_per_trajectory(row):.1f} | "
                    f"{row.get('response_length'):.1f} | {m.get(ENTROPY, math.nan):.3f} | "
                    f"{row.get('grad_norm'):.3g} | {m.get(PROB_DIFF_MEAN, math.nan):.2g} | "
                    f"{row.get('wall_s'):.1f} |"
                )
        return "\n".join(lines)

    def report(self) -> str:
        gate = self.gate.line() if self.gate else "variance gate: not run"
        return "\n".join(
            [
                f"model {self.model_dir}, {self.dtype}: {self.dtype_reason}",
                gate,
                self.table(),
                "",
                f"greedy probe on {self.probe_questions} held-out dev questions (mean score of the stage's reward: "
                f"{'say something without inventing a tool response' if self.stage == 'own-turn' else 'closed 0.5, retrieves 1'}): initial {self.probe_initial:.3f}, merged "
                f"{self.probe_merged:.3f}; distinct openings (first 5 words) {self.probe_openings[0]} -> "
                f"{self.probe_openings[1]}",
                "phase times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in self.phases.items()),
                *([self.checks] if self.checks else []),
            ]
        )


def learn_settings(
    out_dir: Path,
    model_dir: Path,
    url: str,
    *,
    experiment: str,
    steps: int,
    lr: float,
    seed: int,
    max_prompt_length: int = 1024,
    max_response_length: int = 512,
) -> TrainSettings:
    """The real run's settings on top of the CPU runs' (module docstring, step 3)."""
    from searchrl.trainer.proofs.train_cpu import cpu_settings

    return cpu_settings(
        out_dir, model_dir, url, steps=steps
    ).with_changes(
        **{
            "experiment_name": experiment,
            "chat_template": "searchrl",
            "seed": seed,
            "train_batch_size": 1,
            "ppo_mini_batch_size": 1,
            "micro_batch_size_per_gpu": SAMPLES,
            "rollout_n": SAMPLES,
            "save_freq": steps,
            "max_turns": 1,  # the scripted call, its response, then the model's one turn (query: learn_overrides)
            "max_prompt_length": max_prompt_length,
            "max_response_length": max_response_length,
            "topk": TOPK,
            "passage_max_chars": PASSAGE_CHARS,
            "lr": lr,
            "lr_warmup_ratio": 0.0,
            "kl_coef": 0.0,
            "entropy_coeff": 0.0,
        }
    )


def learn_overrides(
    dtype: str,
    seed: int,
    turn_tokens: int,
    random_reward: float | None = None,
    *,
    stage: str = "own-turn",
    retrieval_url: str = "",
) -> list[str]:
    """The CPU overrides, the run's precision, the reward, a seeded rollout and the per-turn token budget; with
    `random_reward` the reward is a coin flip at that rate (the null run, trainer/proofs/rewards.py). Stage 2 scripts
    the search-call opening instead of the whole call and scores the query against `retrieval_url`."""
    from searchrl.trainer.overrides import hydra_value
    from searchrl.trainer.proofs.real import precision_overrides
    from searchrl.trainer.proofs.real_query import OPENING_NAME
    from searchrl.trainer.proofs.train_cpu import cpu_overrides

    query = stage == "query"
    pairs: list[tuple[str, object]] = [
        ("reward.custom_reward_function.path", QUERY_REWARD_FN_PATH if query else REWARD_FN_PATH),
        ("reward.custom_reward_function.name", QUERY_REWARD_FN_NAME if query else REWARD_FN_NAME),
        ("actor_rollout_ref.rollout.seed", seed),
        (f"+{SEARCHRL_KWARGS}.turn_max_tokens", turn_tokens),
    ]
    if random_reward is not None:
        if query:
            raise ConfigError("--random-reward runs stage 1's null; stage 2 (--stage query) has none yet")
        pairs.append(("+reward.custom_reward_function.reward_kwargs.random_rate", random_reward))
    if query:
        pairs += [
            (f"+{SEARCHRL_KWARGS}.scripted_opening", OPENING_NAME),
            # the model's one turn ends the trajectory: a second call it might write is not executed
            ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", 1),
            ("+reward.custom_reward_function.reward_kwargs.retrieval_url", retrieval_url),
        ]
    return [
        *cpu_overrides(scripted_first_turn=not query),
        *precision_overrides(dtype),
        *(f"{key}={hydra_value(value)}" for key, value in pairs),
    ]


def held_out_rows(qa_source: Path, skip: int, limit: int | None = None) -> list[dict[str, object]]:
    """Dev rows after the run's slice (the run never trains or gates on them)."""
    lines = [line for line in qa_source.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = lines[skip:] if limit is None else lines[skip : skip + limit]
    return [json.loads(line) for line in rows]


def held_out_questions(qa_source: Path, skip: int, limit: int | None = None) -> list[str]:
    """Dev questions after the run's slice (the run never trains or gates on them)."""
    return [str(row["question"]) for row in held_out_rows(qa_source, skip, limit)]


def distinct_openings(turns: Sequence[str], words: int = 5) -> int:
    """How many different openings (the first `words` words, lowercased) the turns have."""
    return len({" ".join(turn.lower().split()[:words]) for turn in turns})


def _round_up(value: int, to: int) -> int:
    return -(-value // to) * to


def sequence_lengths(
    settings: TrainSettings, model_dir: Path, turn_tokens: int, stage: str = "own-turn"
) -> tuple[int, int]:
    """(max prompt, max response) tokens for verl, from the train questions' own contexts plus the turn budget.

    Under sdpa every row is padded to the maximum (DESIGN.md 3e), so a loose bound costs compute every step."""
    from searchrl.prompt import build_messages
    from searchrl.trainer.data import train_questions
    from searchrl.trainer.proofs.real_gate import load_tokenizer, stage_contexts
    from searchrl.trainer.proofs.turn_context import chat_ids

    tokenizer = load_tokenizer(model_dir, "searchrl")
    questions = train_questions(settings)
    contexts = stage_contexts(settings, tokenizer, questions, stage)
    prompts = [len(chat_ids(tokenizer, build_messages(question))) for question in questions]
    after_prompt = max(len(c) - p for c, p in zip(contexts, prompts, strict=True))
    return _round_up(max(prompts) + 8, 64), _round_up(after_prompt + turn_tokens + 16, 32)


def run_real_learn(
    out_dir: Path,
    model_dir: Path,
    *,
    qa_source: Path,
    questions: int = QUESTIONS,
    lrs: Sequence[float] = LRS,
    pilot_steps: int = PILOT_STEPS,
    turn_tokens: int = TURN_TOKENS,
    precision: str = "auto",
    seed: int = 0,
    gate_only: bool = False,
    random_reward: float | None = None,
    timeout_s: float = 3600.0,
    stage: str = "own-turn",
) -> RealLearnRun:
    """The whole run (module docstring). Raises ConfigError at the gate; returns the run for its checks."""
    from searchrl.retrieval.process import served
    from searchrl.trainer.data import prepare_data
    from searchrl.trainer.launch import check_retrieval
    from searchrl.trainer.proofs.real import require_inputs
    from searchrl.trainer.proofs.train_cpu import write_qa
    from searchrl.trainer.toolconfig import write_tool_config

    require_inputs(model_dir, qa_source)
    _check_learn_args(stage, random_reward, turn_tokens, pilot_steps, lrs)
    run = _start_run(out_dir, model_dir, precision, stage)
    out_dir = run.out_dir
    write_qa(out_dir, qa_source, questions)
    with served(["--backend", "bm25"], out_dir / "serve.log") as url:
        base = learn_settings(
            out_dir, run.model_dir, url, experiment=EXPERIMENT, steps=2, lr=lrs[0], seed=seed
        )
        check_retrieval(base)
        data = prepare_data(base)
        write_tool_config(base)
        run.epoch_steps = data.train_rows
        _run_gate(run, base, turn_tokens, seed, stage)
        if gate_only:
            return run
        prompt_len, response_len = sequence_lengths(base, run.model_dir, turn_tokens, stage)
        extra = learn_overrides(run.dtype, seed, turn_tokens, random_reward, stage=stage, retrieval_url=url)
        trainer = _Trainer(run, url, seed, stage, timeout_s, prompt_len, response_len, extra)
        _pilot_and_train(run, trainer, lrs, pilot_steps)
        started = time.monotonic()
        probe(run, qa_source, questions, turn_tokens, url, prompt_len, response_len)
        run.phases["merge and probe"] = time.monotonic() - started
    (out_dir / "steps.md").write_text(run.report() + "\n", encoding="utf-8")
    return run


def _check_learn_args(
    stage: str, random_reward: float | None, turn_tokens: int, pilot_steps: int, lrs: Sequence[float]
) -> None:
    """Refuse a combination of flags the run cannot honour, before it deletes or loads anything."""
    from searchrl.trainer.proofs.real_gate import STAGES

    if stage not in STAGES:
        raise ConfigError(f"--stage {stage!r}: one of {', '.join(STAGES)}")
    if random_reward is not None and stage == "query":
        raise ConfigError("--random-reward runs stage 1's null; stage 2 (--stage query) has none yet")
    if turn_tokens < 1 or pilot_steps < 2 or not lrs or any(not lr > 0 for lr in lrs):
        raise ConfigError(
            f"--turn-tokens {turn_tokens}, --pilot-steps {pilot_steps}, --lrs {list(lrs)}: the budget must be "
            "positive, a pilot at least 2 steps, every lr above 0"
        )
    if random_reward is not None and not 0 <= random_reward <= 1:
        raise ConfigError(f"--random-reward {random_reward}: a rate between 0 and 1 (e.g. the gate's mean)")


def _start_run(out_dir: Path, model_dir: Path, precision: str, stage: str) -> RealLearnRun:
    """A fresh, empty `out_dir` (a rerun never mixes with an old one's files) and the run's precision."""
    from searchrl.trainer.cpu.precision import choose_cpu_dtype

    out_dir = fresh_out_dir(out_dir)
    run = RealLearnRun(out_dir, model_dir.resolve(), stage=stage)
    started = time.monotonic()
    run.dtype, run.dtype_reason = choose_cpu_dtype(model_dir, precision)
    log.info("precision %s", run.dtype_reason)
    run.phases["precision"] = time.monotonic() - started
    return run


def _run_gate(run: RealLearnRun, base: TrainSettings, turn_tokens: int, seed: int, stage: str) -> None:
    """Step 1 (module docstring): sample the initial policy, write gate.json, and stop the run (ConfigError)
    when no group varies, as GRPO would then have nothing to learn from."""
    from searchrl.trainer.proofs.real_gate import check_gate, gate, null_rise

    started = time.monotonic()
    run.gate = gate(
        base, run.model_dir, n=SAMPLES, max_tokens=turn_tokens, dtype=run.dtype, seed=seed, stage=stage
    )
    run.phases["gate"] = time.monotonic() - started
    run.null = null_rise(run.gate.scores)
    log.info("%s", run.gate.line())
    (run.out_dir / "gate.json").write_text(run.gate.to_json() + "\n", encoding="utf-8")
    check_gate(run.gate)


@dataclass
class _Trainer:
    """Runs one verl invocation of the run (a pilot or the run itself) with the run's fixed settings, and checks
    every step as it arrives and all of them at the end."""

    run: RealLearnRun
    url: str  # the run's BM25 service
    seed: int
    stage: str
    timeout_s: float
    prompt_len: int
    response_len: int
    extra: list[str]  # learn_overrides
    texts: list[str] = field(default_factory=list)  # every invocation's log, for the checks line

    def train(self, experiment: str, steps: int, lr: float) -> list[StepRow]:
        from searchrl.trainer.proofs.real import check_real_steps
        from searchrl.trainer.proofs.train_cpu import run_training

        run = self.run
        settings = learn_settings(
            run.out_dir,
            run.model_dir,
            self.url,
            experiment=experiment,
            steps=steps,
            lr=lr,
            seed=self.seed,
            max_prompt_length=self.prompt_len,
            max_response_length=self.response_len,
        )
        began = time.monotonic()
        rows, text = run_training(
            settings,
            self.extra,
            run.out_dir / f"{experiment}.log",
            experiment,
            self.timeout_s,
            lambda row: check_real_steps([row], run.dtype, per_step=True),
        )
        self.texts.append(text)
        # the query stage's searches run in its reward, not in verl's tool
        problems = check_real_steps(rows, run.dtype, steps=steps, searching=self.stage != "query")
        if problems:
            raise SmokeCheckError(f"{experiment} missed what training must show: " + "; ".join(problems))
        run.phases[experiment] = time.monotonic() - began
        return rows


def _pilot_and_train(run: RealLearnRun, trainer: _Trainer, lrs: Sequence[float], pilot_steps: int) -> None:
    """Steps 2 and 3 (module docstring): the lr pilots when there is a choice, the two-epoch run at the lr kept,
    the curve redrawn after each, then the step checks' line over everything trained."""
    from searchrl.trainer.proofs.train_cpu import run_checks_line

    if len(lrs) > 1:
        for lr in lrs:
            run.pilots[lr] = trainer.train(f"pilot-lr{lr:g}", pilot_steps, lr)
            plot_curve(run, run.out_dir / "reward_curve.png")
        run.lr = pick_lr(run.pilots)
        log.info("lr pilot picked %g", run.lr)
    else:
        run.lr = lrs[0]
    run.rows = trainer.train(EXPERIMENT, 2 * run.epoch_steps, run.lr)
    plot_curve(run, run.out_dir / "reward_curve.png")
    trained = [row for rows in run.pilots.values() for row in rows] + run.rows
    run.checks = run_checks_line(trained, trainer.texts, mean_bound=run.dtype != "float32")


def probe(
    run: RealLearnRun,
    qa_source: Path,
    skip: int,
    turn_tokens: int,
    url: str,
    prompt_len: int,
    response_len: int,
) -> None:
    """Greedy turns on held-out dev questions with the initial and the merged model (module docstring, step 4)."""
    from searchrl.trainer.merge import merge_latest
    from searchrl.trainer.plugins.reward import golden_answers
    from searchrl.trainer.proofs.real_gate import greedy_share, load_tokenizer, stage_contexts, stage_scorer

    settings = learn_settings(
        run.out_dir,
        run.model_dir,
        url,
        experiment=EXPERIMENT,
        steps=2 * run.epoch_steps,
        lr=run.lr,
        seed=0,
    )
    merged = merge_latest(settings.run_dir)
    rows = held_out_rows(qa_source, skip, PROBE_QUESTIONS)
    questions = [str(row["question"]) for row in rows]
    scorer = stage_scorer(settings, run.stage, [golden_answers(row.get("golden_answers")) for row in rows])
    tokenizer = load_tokenizer(run.model_dir, "searchrl")
    contexts = stage_contexts(settings, tokenizer, questions, run.stage)
    run.probe_questions = len(contexts)
    run.probe_initial, before = greedy_share(
        run.model_dir, tokenizer, contexts, max_tokens=turn_tokens, scorer=scorer
    )
    run.probe_merged, after = greedy_share(
        merged.target_dir, tokenizer, contexts, max_tokens=turn_tokens, scorer=scorer
    )
    run.probe_openings = (distinct_openings(before), distinct_openings(after))
    (run.out_dir / "probe.json").write_text(
        json.dumps(
            [
                {"question": q, "initial": b, "merged": a}
                for q, b, a in zip(questions, before, after, strict=True)
            ],
            indent=1,
            ensure_ascii=False,
        ),
        encoding="utf-8",
    )


def plot_curve(run: RealLearnRun, path: Path) -> Path:
    """Reward and invented tool-response tokens a trajectory per step (pilots thin, the run thick), the gate's
    mean and the epoch means with the null band."""
    from searchrl.trainer.proofs.plots import pyplot, save, step_axis

    plt = pyplot()

    def lower(row: StepRow) -> float:
        # stage 1: what it must stop doing; stage 2 (no invented tokens to count): the length of what it writes
        return invented_per_trajectory(row) if run.stage == "own-turn" else row.get("response_length")

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for lr, rows in run.pilots.items():
        steps = [row.step for row in rows]
        top.plot(steps, [row.get("reward") for row in rows], lw=0.8, alpha=0.6, label=f"pilot lr {lr:g}")
        bottom.plot(steps, [lower(r) for r in rows], lw=0.8, alpha=0.6)
    if run.rows:
        steps = [row.step for row in run.rows]
        top.plot(
            steps, [row.get("reward") for row in run.rows], lw=2, color="black", label=f"run lr {run.lr:g}"
        )
        bottom.plot(steps, [lower(r) for r in run.rows], lw=2, color="black")
        if len(run.rows) == 2 * run.epoch_steps:
            _, r1, r2, i1, i2 = run.ends()
            e = run.epoch_steps
            top.hlines(
                [r1, r2], [0.5, e + 0.5], [e + 0.5, 2 * e + 0.5], colors="tab:red", label="epoch means"
            )
            if run.gate is not None:
                top.fill_between([0.5, 2 * e + 0.5], run.gate.mean, run.gate.mean + run.null, color="grey",
                                 alpha=0.15, label="gate mean + null (95th pct)")  # fmt: skip
            if run.stage == "own-turn":
                bottom.hlines([i1, i2], [0.5, e + 0.5], [e + 0.5, 2 * e + 0.5], colors="tab:red")
            top.axvline(e + 0.5, ls=":", color="grey")
            bottom.axvline(e + 0.5, ls=":", color="grey")
    if run.gate is not None:
        top.axhline(run.gate.mean, ls="--", color="grey", lw=0.8, label="gate mean (initial policy)")
    top.set_ylabel("mean reward of the step's 8 samples")
    bottom.set_ylabel(
        "invented tool-response\ntokens / trajectory"
        if run.stage == "own-turn"
        else "response length (tokens)"
    )
    step_axis(bottom, "GRPO step (1 question x 8 samples)")
    what = (
        "own turn after a real search" if run.stage == "own-turn" else "query closing a scripted call opening"
    )
    top.set_title(f"make learn-cpu-real: SmolLM2-135M, {what} (2 CPU cores)", fontsize=10)
    top.legend(fontsize=7)
    return save(fig, path)


__all__ = [
    "EXPERIMENT",
    "LRS",
    "MIN_DROP",
    "PILOT_STEPS",
    "TURN_TOKENS",
    "RealLearnRun",
    "distinct_openings",
    "epochs",
    "held_out_questions",
    "held_out_rows",
    "invented_per_trajectory",
    "learn_overrides",
    "learn_settings",
    "pick_lr",
    "plot_curve",
    "probe",
    "run_real_learn",
]
