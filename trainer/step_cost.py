"""What one training step costs on the GPU nodes, before anything is billed (`searchrl sky train --dry-run`).

Pure arithmetic, importable in SkyPilot's venv (no torch, no verl): the plan runs there. Two kinds of figures:

- **Counted** with verl's own micro-batch rules: `fixed_micro_batches` is verl 0.9.1's `prepare_micro_batches`
  without dynamic batching (`tu.chunk_tensordict`: equal consecutive chunks), `dynamic_micro_batches` restates
  its dynamic branch (`utils/seqlen_balancing.py` `rearrange_micro_batches` with `karmarkar_karp`) in plain Python.
  tests/trainer/test_step_cost.py runs verl's own `prepare_micro_batches` on the same lengths in the dev venv and
  pins both to it (same micro batches, same tokens in each), so a verl upgrade that changes them fails a test.
  What they are counted over is an ASSUMPTION: `sample_lengths`, a length distribution derived from the recipe's
  budgets (prompt share, searches per answer, observation size), since real lengths exist only after a rollout.
- **ESTIMATES** (labelled so wherever printed): FLOPs, seconds and cross-node bytes, from the model's parameter
  count and shape, verl's FSDP defaults (bf16 parameters gathered per FSDP unit, fp32 gradient reduction,
  parameters resharded after forward, gradient checkpointing) and the link speeds in `Hardware`. Formulas:
  docs/deploy.md "What a step costs".

`choose_packing` decides padded vs packed micro batches under sdpa (TrainSettings.remove_padding=auto): the
cheaper estimated step wins, and the reason is printed with the plan.
"""

from __future__ import annotations

import heapq
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from searchrl.trainer.settings import TrainSettings

CHARS_PER_TOKEN = 4.0  # ASSUMPTION: English Wikipedia text in Qwen2.5's tokenizer (~4 characters a token)
MODEL_TURN_TOKENS = 100  # ASSUMPTION: <think> plus a <tool_call> per search turn
ANSWER_TOKENS = 80  # ASSUMPTION: the final <think> + <answer> turn


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs of a model (from its config.json on the Hub)."""

    params: int  # all parameters
    layers: int
    hidden: int
    vocab: int
    tied: bool  # input embedding shared with the LM head

    @property
    def matmul_params(self) -> int:
        """Parameters used in matrix multiplies per token (the input embedding is a lookup unless tied)."""
        return self.params if self.tied else self.params - self.vocab * self.hidden


# Qwen2.5 (base and -Instruct share a shape): num_hidden_layers, hidden_size, vocab_size, tie_word_embeddings.
MODEL_SHAPES: dict[str, ModelShape] = {
    "qwen2.5-0.5b": ModelShape(494_032_768, 24, 896, 151_936, True),
    "qwen2.5-1.5b": ModelShape(1_543_714_304, 28, 1536, 151_936, True),
    "qwen2.5-3b": ModelShape(3_085_938_688, 36, 2048, 151_936, True),
    "qwen2.5-7b": ModelShape(7_615_616_512, 28, 3584, 152_064, False),
}


def model_shape(model_name: str) -> ModelShape | None:
    """The shape of a known model by its Hub id (Qwen/Qwen2.5-3B-Instruct -> qwen2.5-3b), else None."""
    base = model_name.rstrip("/").rsplit("/", 1)[-1].lower()
    return MODEL_SHAPES.get(re.sub(r"-instruct$", "", base))


@dataclass(frozen=True)
class Hardware:
    """ESTIMATES for an H100 SXM node (change them here, not in the formulas)."""

    flops: float = 989e12 * 0.40  # bf16 dense peak x an assumed 40% model FLOPs utilisation
    nvlink_bytes_s: float = 350e9  # NCCL bus bandwidth inside a node (NVLink 4)
    # Cross-node, per node: SkyPilot's `standard` network tier is TCP; 40-200 Gbit/s brackets what clouds give an
    # 8-GPU VM without EFA/InfiniBand (the low end is used to choose, both ends are printed)
    node_link_bytes_s: tuple[float, float] = (40e9 / 8, 200e9 / 8)


HARDWARE = Hardware()


# --- the assumed lengths ------------------------------------------------------------------------------------------
def sample_lengths(
    count: int,
    *,
    max_prompt: int,
    max_response: int,
    max_turns: int,
    observation_chars: int,
    seed: int = 0,
) -> list[int]:
    """ASSUMPTION: `count` trajectory lengths (prompt + response tokens) as a Search-R1 batch might hold them.

    Prompts fill 30-60% of max_prompt (chat template, tool schema, question); an answer makes 0..max_turns
    searches, evenly spread; each search costs MODEL_TURN_TOKENS plus an observation of 50-100% of the
    observation budget (observation_chars / CHARS_PER_TOKEN); the answer turn ANSWER_TOKENS; the response is cut
    at max_response. Seeded: the same settings always give the same figures.
    """
    rng = random.Random(seed)
    obs = observation_chars / CHARS_PER_TOKEN
    out = []
    for i in range(count):
        prompt = int(max_prompt * rng.uniform(0.3, 0.6))
        searches = i % (max_turns + 1)
        response = ANSWER_TOKENS + sum(
            int(MODEL_TURN_TOKENS + obs * rng.uniform(0.5, 1.0)) for _ in range(searches)
        )
        out.append(prompt + min(response, max_response))
    rng.shuffle(out)
    return out


# --- verl's micro batches, restated ----------------------------------------------------------------------------
def fixed_micro_batches(lengths: list[int], rows: int) -> list[list[int]]:
    """verl's prepare_micro_batches with use_dynamic_bsz=False: len // rows consecutive chunks of `rows`."""
    if len(lengths) % rows:
        raise ValueError(f"{len(lengths)} samples are not a multiple of micro batch {rows} (verl asserts it)")
    return [lengths[i : i + rows] for i in range(0, len(lengths), rows)]


def _karmarkar_karp(values: list[int], k: int) -> list[list[int]]:
    """verl's seqlen_balancing.karmarkar_karp(equal_size=False), same tie-breaking: index lists per partition."""

    class _Set:
        __slots__ = ("items", "sum")

        def __init__(self) -> None:
            self.sum = 0
            self.items: list[tuple[int, int]] = []

        def __lt__(self, other: _Set) -> bool:
            if self.sum != other.sum:
                return self.sum < other.sum
            if len(self.items) != len(other.items):
                return len(self.items) < len(other.items)
            return self.items < other.items

    class _State:
        __slots__ = ("sets",)

        def __init__(self, idx: int, value: int) -> None:
            self.sets = [_Set() for _ in range(k)]
            self.sets[0].items.append((idx, value))
            self.sets[0].sum = value
            self.sets.sort(reverse=True)

        def spread(self) -> int:
            return self.sets[0].sum - self.sets[-1].sum

        def __lt__(self, other: _State) -> bool:
            if self.spread() != other.spread():
                return self.spread() > other.spread()
            return self.sets[0] > other.sets[0]

    heap: list[_State] = []
    for value, idx in sorted((v, i) for i, v in enumerate(values)):
        heapq.heappush(heap, _State(idx, value))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        for i in range(k):
            mine, theirs = first.sets[i], second.sets[k - 1 - i]
            mine.items.extend(theirs.items)
            mine.sum += theirs.sum
        first.sets.sort(reverse=True)
        heapq.heappush(heap, first)
    return [sorted(idx for idx, _ in s.items) for s in heap[0].sets]


def dynamic_micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """verl's prepare_micro_batches with use_dynamic_bsz=True on one rank (rearrange_micro_batches): start at
    ceil(tokens / budget) micro batches, balance the attention workload 24576*l + l^2 with Karmarkar-Karp, add one
    until every micro batch fits the budget. Returns each micro batch's lengths (verl then reorders them)."""
    if max(lengths) > max_tokens:
        raise ValueError(
            f"a {max(lengths)}-token sample exceeds the {max_tokens}-token budget (verl asserts it)"
        )
    count = min(len(lengths), -(-sum(lengths) // max_tokens))
    workloads = [24576 * n + n * n for n in lengths]
    while True:
        parts = _karmarkar_karp(workloads, count)
        if all(sum(lengths[i] for i in part) <= max_tokens for part in parts):
            return [[lengths[i] for i in part] for part in parts]
        count += 1


# --- one phase, one layout -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Phase:
    """One pass over a GPU's share of the batch: the update (per mini batch), old log-probs or reference."""

    name: str
    micro_batches: int  # per GPU per call
    calls: int  # per step (mini batches for the update, 1 for the log-prob passes)
    real_tokens: int  # per GPU per call
    processed_tokens: int  # per GPU per call, padding included
    attention_units: float  # sum over micro batches of the attention kernel's L^2 (per GPU per call)
    backward: bool

    @property
    def padded_share(self) -> float:
        return 1 - self.real_tokens / self.processed_tokens if self.processed_tokens else 0.0


def _phase(
    name: str,
    lengths: list[int],
    calls: int,
    backward: bool,
    *,
    packed: bool,
    flash: bool,
    rows: int,
    budget: int,
) -> Phase:
    """verl's micro batches for one GPU's samples, with what they process (padding) and their attention rows."""
    if packed:
        batches = dynamic_micro_batches(lengths, budget)
        processed = sum(lengths)
        # flash-attn's varlen kernel: causal, per sample; sdpa: the packed row's dense (block-diagonal) mask
        attention = (
            sum(n * n / 2 for mb in batches for n in mb) if flash else sum(sum(mb) ** 2 for mb in batches)
        )
    else:
        batches = fixed_micro_batches(lengths, rows)
        processed = sum(len(mb) * max(mb) for mb in batches)  # each micro batch padded to its longest sample
        attention = sum(len(mb) * max(mb) ** 2 for mb in batches)  # sdpa with a padding mask: dense
    return Phase(name, len(batches), calls, sum(lengths), processed, attention, backward)


# --- the step -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepCost:
    packed: bool
    phases: tuple[Phase, ...]
    fsdp_group: int  # GPUs one model is sharded over
    grad_syncs_per_mini_batch: int
    compute_s: float  # ESTIMATE
    intra_node_s: float  # ESTIMATE
    cross_node_bytes: float  # ESTIMATE, sent by each node per step
    cross_node_s: tuple[float, float]  # ESTIMATE, at the low and high link speed

    def step_s(self, link: int = 0) -> float:
        return self.compute_s + self.intra_node_s + self.cross_node_s[link]


@dataclass(frozen=True)
class _Inputs:
    """Everything in TrainSettings that the cost depends on (hashable: one computation per distinct run)."""

    shape: ModelShape
    nnodes: int
    gpus_per_node: int
    fsdp_size: int  # verl's fsdp_config.fsdp_size (-1 = every GPU)
    no_sync: bool  # fsdp_config.use_no_sync_for_gradient_accumulation
    train_batch: int
    mini_batch: int
    rollout_n: int
    rows: int  # micro batch rows when padded
    budget: int  # tokens per GPU per micro batch when packed
    flash: bool
    kl: bool  # a reference pass runs
    max_prompt: int
    max_response: int
    max_turns: int
    observation_chars: int

    def lengths(self, count: int, seed: int) -> list[int]:
        """`count` sequence lengths of this run's shape (sample_lengths with its prompt, response and turn limits)."""
        return sample_lengths(
            count,
            max_prompt=self.max_prompt,
            max_response=self.max_response,
            max_turns=self.max_turns,
            observation_chars=self.observation_chars,
            seed=seed,
        )


def _inputs(s: TrainSettings, shape: ModelShape) -> _Inputs:
    return _Inputs(
        shape=shape,
        nnodes=s.trainer_nodes,  # separate_async: the rollout nodes take no part in the update
        gpus_per_node=s.gpus_per_node,
        fsdp_size=s.fsdp_size,
        no_sync=s.sync_grads_per_mini_batch,
        train_batch=s.train_batch_size,
        mini_batch=s.mini_batch_size,
        rollout_n=s.rollout_n,
        rows=s.micro_batch_rows,
        budget=s.token_budget_per_gpu,
        flash=s.flash_attn,
        kl=s.kl_coef > 0,
        max_prompt=s.max_prompt_length,
        max_response=s.max_response_length,
        max_turns=s.max_turns,
        observation_chars=s.max_tool_response_chars,
    )


@lru_cache(maxsize=64)
def _step_cost(x: _Inputs, packed: bool, hw: Hardware = HARDWARE) -> StepCost:
    n_gpus = x.nnodes * x.gpus_per_node
    per_mini = x.mini_batch * x.rollout_n // n_gpus  # one GPU's samples in a PPO mini batch
    per_step = x.train_batch * x.rollout_n // n_gpus  # ... in the whole batch (the log-prob passes)

    def phase(name: str, count: int, calls: int, backward: bool) -> Phase:
        return _phase(
            name, x.lengths(count, 0 if backward else 1), calls, backward,
            packed=packed, flash=x.flash, rows=x.rows, budget=x.budget,
        )  # fmt: skip

    phases = [phase("update", per_mini, x.train_batch // x.mini_batch, True)]
    phases.append(phase("old log-prob", per_step, 1, False))
    if x.kl:
        phases.append(phase("reference", per_step, 1, False))

    p, shape = x.shape.params, x.shape
    compute = 0.0
    for ph in phases:
        fwd = (
            2 * shape.matmul_params * ph.processed_tokens
            + 4 * shape.layers * shape.hidden * ph.attention_units
        )
        # update: forward, backward (2x), and the recomputed forward of gradient checkpointing
        compute += ph.calls * fwd * (4 if ph.backward else 1)
    group = n_gpus if x.fsdp_size < 0 or x.fsdp_size >= n_gpus else x.fsdp_size
    update = phases[0]
    syncs = 1 if x.no_sync else update.micro_batches
    # FSDP per micro batch: all-gather bf16 params (2P bytes) in forward and again in backward (resharded after
    # forward); gradient reduce-scatter in fp32 (4P) per sync; one more all-gather to export weights to the rollout
    gathers = sum(ph.calls * ph.micro_batches * (2 if ph.backward else 1) for ph in phases) + 1
    gather_bytes = gathers * 2 * p
    reduce_bytes = update.calls * syncs * 4 * p
    ring = (group - 1) / group  # share of a collective's bytes each member sends (ring)
    if group > x.gpus_per_node:  # the FSDP group spans nodes: every collective crosses the node link
        cross = (gather_bytes + reduce_bytes) * ring
        intra_s = 0.0
    else:  # FSDP inside a node; replicas all-reduce their gradient shards across nodes (HSDP)
        replicas = n_gpus // group
        all_reduce = update.calls * syncs * 2 * (replicas - 1) / replicas * 4 * p if replicas > 1 else 0.0
        intra = (gather_bytes + reduce_bytes) * ring
        if x.nnodes == 1:  # REHEARSE_MULTI_NODE: the replicas share the node; each GPU all-reduces its shard
            cross, intra = 0.0, intra + all_reduce / group
        else:
            cross = all_reduce
        intra_s = intra / hw.nvlink_bytes_s
    lo, hi = hw.node_link_bytes_s
    return StepCost(
        packed=packed,
        phases=tuple(phases),
        fsdp_group=group,
        grad_syncs_per_mini_batch=syncs,
        compute_s=compute / hw.flops,
        intra_node_s=intra_s,
        cross_node_bytes=cross,
        cross_node_s=(cross / lo, cross / hi),
    )


def step_cost(settings: TrainSettings, packed: bool) -> StepCost | None:
    """The ESTIMATED cost of one step with padded or packed micro batches; None for a model of unknown shape."""
    shape = model_shape(settings.model_name)
    return None if shape is None else _step_cost(_inputs(settings, shape), packed)


def _secs(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


@dataclass(frozen=True)
class PackingChoice:
    packed: bool
    reason: str


def choose_packing(settings: TrainSettings) -> PackingChoice:
    """remove_padding=auto under sdpa: the cheaper ESTIMATED step of padded and packed (see the module docstring)."""
    s = settings
    if s.flash_attn:
        return PackingChoice(True, "flash-attn's varlen kernels need packed micro batches")
    if s.remove_padding != "auto":
        return PackingChoice(s.remove_padding == "on", f"SEARCHRL_TRAIN_REMOVE_PADDING={s.remove_padding}")
    per_gpu = s.mini_batch_size * s.rollout_n // s.n_gpus
    if per_gpu % s.micro_batch_rows:
        return PackingChoice(
            True, f"padded micro batches of {s.micro_batch_rows} rows do not divide {per_gpu}"
        )
    shape = model_shape(s.model_name)
    if shape is None:
        return PackingChoice(
            False, f"{s.model_name}: unknown model shape, no estimate; verl's padded default"
        )
    try:
        packed, padded = (_step_cost(_inputs(s, shape), flag) for flag in (True, False))
    except ValueError as exc:  # a budget below the longest sample: verl would refuse packing
        return PackingChoice(False, f"packing impossible: {exc}")
    pick = packed.step_s() <= padded.step_s()
    return PackingChoice(
        pick,
        f"ESTIMATED training phases {_secs(packed.step_s())} s/step packed vs {_secs(padded.step_s())} s padded "
        f"({sum(p.calls * p.micro_batches for p in packed.phases)} vs "
        f"{sum(p.calls * p.micro_batches for p in padded.phases)} micro batches per GPU, padding "
        f"{padded.phases[0].padded_share:.0%} of padded tokens; sdpa computes a packed row's mask densely)",
    )


def _mode_lines(s: TrainSettings) -> list[str]:
    """The async modes' shape in the plan (sync prints nothing: the figures below are the whole step)."""
    if s.trainer_mode == "sync":
        return []
    bound = f"staleness bound {s.max_off_policy_threshold} weight versions ({s.max_off_policy_strategy} beyond it)"
    if s.trainer_mode == "colocate_async":
        return [f"trainer mode: colocate_async (rollout and actor share every GPU); {bound}"]
    return [
        f"trainer mode: separate_async: trainer {s.trainer_nodes} node(s), rollout {s.rollout_node_count} node(s) "
        f"x {s.gpus_per_node} GPUs; weights pushed over {s.checkpoint_engine} after every "
        f"{s.parameter_sync_step} updates; {bound}; the figures below are the trainer nodes' and leave out that "
        "push (the bf16 weights to every rollout node each step)"
    ]


def plan_lines(settings: TrainSettings) -> list[str]:
    """What `searchrl sky train --dry-run` prints about a step (counted figures, then ESTIMATES)."""
    s = settings
    choice = choose_packing(s)
    cost = step_cost(s, choice.packed)
    layout = "packed (use_remove_padding, dynamic batching)" if choice.packed else "padded (fixed rows)"
    if s.rehearse_multi_node:
        where = f"HSDP {s.fsdp_replicas} x {s.fsdp_size} inside the node, as on {s.fsdp_replicas} nodes"
    elif s.trainer_nodes == 1:
        where = "the node's GPUs"
    else:
        where = (
            "inside each node"
            if s.fsdp_size > 0
            else "across every node: the node link carries every collective"
        )
    # REHEARSE_MULTI_NODE: what the overrides render from the same properties (trainer/overrides.py)
    rehearsal = (
        [
            f"rehearsal of the multi-node trainer on one node: {s.fsdp_strategy.upper()}, "
            f"{'no-sync' if s.sync_grads_per_mini_batch else 'a sync per micro batch'}, "
            f"HSDP {s.fsdp_replicas} x {s.fsdp_size} (fsdp_size {s.fsdp_size})"
        ]
        if s.rehearse_multi_node
        else []
    )
    out = [
        *rehearsal,
        *_mode_lines(s),
        f"micro batches: {layout} -- {choice.reason}",
        f"FSDP group: {s.fsdp_size if s.fsdp_size > 0 else s.n_gpus} GPUs ({where}); gradient sync: "
        f"{'once per mini batch' if s.sync_grads_per_mini_batch else 'after every micro batch'}",
    ]
    try:
        other = step_cost(s, not choice.packed)
    except ValueError:  # the other layout is impossible here (see choose_packing)
        other = None
    if cost is None:
        return [
            *out,
            f"step cost: not estimated ({s.model_name} is not in trainer/step_cost.py MODEL_SHAPES)",
        ]
    out.append(
        "micro batches per GPU (counted with verl's rules over ASSUMED lengths, trainer/step_cost.py "
        "sample_lengths): "
        + ", ".join(
            f"{ph.name} {ph.micro_batches}" + (f" x {ph.calls} mini batches" if ph.calls > 1 else "")
            for ph in cost.phases
        )
        + f"; padding {cost.phases[0].padded_share:.0%} of the tokens processed"
        + ("" if not choice.packed or other is None else f" ({other.phases[0].padded_share:.0%} if padded)")
    )
    lo, hi = HARDWARE.node_link_bytes_s
    out.append(
        f"ESTIMATE per step: compute {cost.compute_s:.0f} s, FSDP inside nodes {cost.intra_node_s:.0f} s, "
        f"cross-node {cost.cross_node_bytes / 1e9:,.1f} GB per node = {cost.cross_node_s[1]:.0f}-"
        f"{cost.cross_node_s[0]:.0f} s at {hi * 8 / 1e9:.0f}-{lo * 8 / 1e9:.0f} Gbit/s "
        "(rollout generation not included; formulas: docs/deploy.md)"
    )
    hours = [s.n_gpus * s.total_steps * cost.step_s(link) / 3600 for link in (1, 0)]
    out.append(
        f"ESTIMATE for {s.total_steps} steps: {hours[0]:,.0f}-{hours[1]:,.0f} GPU-hours in the training phases"
    )
    return out


__all__ = [
    "HARDWARE",
    "MODEL_SHAPES",
    "Hardware",
    "ModelShape",
    "PackingChoice",
    "Phase",
    "StepCost",
    "choose_packing",
    "dynamic_micro_batches",
    "fixed_micro_batches",
    "model_shape",
    "plan_lines",
    "sample_lengths",
    "step_cost",
]
