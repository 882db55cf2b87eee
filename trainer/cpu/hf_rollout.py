"""The `hf` rollout engine: Hugging Face `generate` behind verl's rollout server interface, for CPU runs.

verl 0.9.1 rolls out through a server (vLLM, sglang, TensorRT-LLM) that the agent loop calls token-in,
token-out; none of them runs without an accelerator, and the legacy `HFRollout` is abstract. So `make
train-cpu` registers this engine under `actor_rollout_ref.rollout.name=hf` (trainer/cpu/plugin.py). Three parts,
matching verl's (DESIGN.md section 3b):

- `HFRolloutReplica` (verl's `RolloutReplica`): `launch_servers()` starts one `HFGenerateServer` Ray actor per
  replica, named after the replica so the training worker's adapter can find it.
- `HFGenerateServer`: holds its own copy of the policy and answers `generate(request_id, prompt_ids,
  sampling_params, ...) -> TokenOutput` with sampled tokens and their log-probabilities under the current weights.
  Concurrent calls are batched into one left-padded `generate` on all cores, and the log-probs come from that
  sampling pass's logits (no second forward). The precision is `engine_kwargs.hf.dtype` (float32 unless the CPU
  run measured bf16 faster, trainer/cpu/precision.py). verl's sync client sends no `max_tokens`, so a turn may
  generate what is left of `prompt_length + response_length`, capped at `response_length` (the rule verl's sglang
  server applies) and at the request's `max_tokens` when the agent loop sets one (`turn_budget`, as vLLM reads
  it); the agent loop cuts the trajectory at its budget. For verl's async trainers (issue 40) it also pauses: verl's
  `abort_all_requests` stops the running batch after its current token and returns each turn's tokens so far
  ("aborted"), later turns wait for `resume_generation`, and every turn is stamped with the weights version read
  at its batch's start; verl's `FullyAsyncLLMServerClient` resends an aborted turn with `max_tokens` set to what
  is left of its budget. Each update adds an entry to a per-version ledger (`ledger()`), which the async replay
  buffer checks (trainer/plugins/versions.py).
- `HFServerAdapter` (verl's `BaseRollout`, in the training worker): after every actor update verl's naive
  checkpoint engine hands it the new weights tensor by tensor (workers/engine_workers.py:727-827); it sends them to
  the server. The server refuses an update that misses any of its weights (only a tied `lm_head` may be absent),
  prints one `UPDATE_LINE` (trainer/cpu/hf_log.py) per update, which the CPU runs count, and returns the exact
  fingerprint of the weights it now holds (trainer/weight_sync/fingerprint.py). The adapter compares it with the
  fingerprint of what it sent, cast to the server's dtype, and a mismatch raises StepCheckError naming the step:
  verl's `ray.get` on the update re-raises it in the trainer and the run stops before sampling from stale weights.
  A match prints one `SYNC_MATCH_LINE` (trainer/step_checks.py) with the same digest as the update line, as the
  vLLM and sglang adapters do: the runs count the syncs whose fingerprint was compared from these, not from the
  server's update lines, which it prints before the comparison.
  verl's own `training/rollout_probs_diff_max` stays a per-step diagnostic (trainer/step_checks.py).

Log-probabilities are those of the distribution the token was sampled from: the logits divided by the sampling
temperature, as verl's actor divides them when it recomputes `old_log_probs`. The CPU runs' scripted first turn
is not generated here: it is environment, written by their agent loop (trainer/cpu/scripted_agent_loop.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import ray
import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator

from searchrl.batches import run_batch
from searchrl.trainer.cpu import sabotage
from searchrl.trainer.cpu.hf_log import BATCH_LINE, UPDATE_LINE
from searchrl.trainer.plugins.engine_kwargs import engine_kwargs_block
from searchrl.trainer.weight_sync.fingerprint import TensorPrint, check_sync, digest, fingerprint
from searchrl.trainer.weight_sync.match_line import sync_match_line

log = logging.getLogger(__name__)

# The Ray actor name of the server of each replica rank: the adapter finds its server by it, and the CPU runs' async
# replay buffer the servers' ledgers (trainer/cpu/ledger_sampler.py)
HF_SERVER_NAME = "searchrl_hf_rollout_{rank}"


def hf_engine_kwargs(rollout_config: Any) -> dict[str, Any]:
    """This engine's own keys, `engine_kwargs.hf` (dtype, max_batch, threads), {} when the run sets none; the agent
    loops' keys are `engine_kwargs.searchrl` (trainer/plugins/engine_kwargs.py)."""
    return engine_kwargs_block(rollout_config, "hf")


def missing_weights(own: set[str], received: set[str], tied_embeddings: bool) -> list[str]:
    """Names the model has and the update lacks; a tied `lm_head.weight` is the embedding, so it may be absent."""
    missing = own - received
    if tied_embeddings:
        missing.discard("lm_head.weight")
    return sorted(missing)


def sampled_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(token) under the distribution sampling drew from: softmax(logits / T) (T <= 0 means greedy: T = 1)."""
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@dataclass
class _Result:
    """One sequence of a batch: its tokens, their log-probs, why it stopped, and the weights version it ran on."""

    token_ids: list[int]
    log_probs: list[float]
    # "completed" (a stop token or its budget) or "aborted" (abort_all_requests cut it short)
    stop_reason: str
    version: int | None  # global_steps read at the batch's start; None only under sabotage no_version_stamps


@dataclass
class _Request:
    """One `generate` call waiting for its batch."""

    prompt_ids: list[int]
    sampling: tuple[float, float, int]  # temperature, top_p, top_k: a batch shares them
    budget: int
    future: asyncio.Future[_Result]


class _StopOnAbort(StoppingCriteria):
    """Stops every row of a running `generate` after its current token once `abort_all_requests` sets the event."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool)  # type: ignore[return-value]


def _sampling(params: dict[str, Any]) -> tuple[float, float, int]:
    return (
        float(params.get("temperature") or 0.0),
        float(params.get("top_p") or 1.0),
        int(params.get("top_k") or 0),
    )


def turn_budget(response_length: int, room: int, sampling_params: dict[str, Any]) -> int:
    """New tokens a turn may generate: what the context has room for, capped at `response_length` and at the
    request's own `max_tokens` (or sglang's `max_new_tokens`) when it sets one, as verl's vLLM server reads it
    (workers/rollout/vllm_rollout/vllm_async_server.py: the request's value, clamped to [1, room])."""
    cap = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
    budget = min(response_length, room)
    if cap is not None:
        budget = min(budget, int(cap))
    return max(1, budget)


def first_stop(tokens: list[int], stop_ids: set[int]) -> int:
    """How many tokens a sequence keeps: through its first stop token, or all of them."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return i + 1
    return len(tokens)


class HFGenerateServer:
    """One rollout server: a policy copy and a batching `generate` (run as a Ray actor by HFRolloutReplica).

    Concurrent `generate` calls (a step's trajectories reach their model turn at about the same time) wait
    `gather_s` and then run as one left-padded `model.generate` of up to `max_batch` sequences: on 2 cores a
    batch of 8 generates ~3x the tokens per second of one sequence at a time (issue 32). Each token's log-prob
    comes from the logits the sampling pass computed (`output_logits`), not from a second forward.
    """

    def __init__(
        self,
        model_path: str,
        prompt_length: int,
        response_length: int,
        seed: int = 0,
        *,
        dtype: str = "float32",
        max_batch: int = 32,
        gather_s: float = 0.05,
        threads: int | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # all the cores: rollout and the actor update take turns (verl's sync trainer), never run together
        self.threads = threads or len(os.sched_getaffinity(0))
        torch.set_num_threads(self.threads)
        torch.manual_seed(seed)  # rollout.seed: a run's samples differ by seed
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.dtype = getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype).eval()
        self.max_len = prompt_length + response_length
        self.response_length = response_length
        self.max_batch = max_batch
        self.gather_s = gather_s
        eos = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        self.stop_ids = {eos} if eos is not None else set()
        self.global_steps = 0
        self.weight_updates = 0
        self.batches = 0
        self.sequences = 0
        self._pending: list[_Request] = []
        self._drainer: asyncio.Task[None] | None = None
        self._model_lock = threading.Lock()  # weights never change under a running batch
        # verl's async trainers pause generation around a weight update (abort_all_requests ... resume_generation):
        # the gate parks new turns, the event stops a running generate after its current token
        self._gate_open = True
        self._rejecting = False
        self._resumed = asyncio.Event()
        self._abort = threading.Event()
        self._ledger: dict[int, dict[str, str]] = {}

    def ready(self) -> bool:
        return True

    def update_weights(
        self, state: dict[str, torch.Tensor], global_steps: int | None = None
    ) -> dict[str, TensorPrint]:
        """Load the trainer's weights (HF names), all of them; returns the fingerprint of what the model now holds."""
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise ValueError(f"rollout weights not in the model: {unknown[:5]}")
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        missing = missing_weights(set(own), set(state), tied)
        if missing:
            raise ValueError(
                f"rollout weight update lacks {len(missing)} of the model's {len(own)} weights "
                f"({', '.join(missing[:5])}): generation would mix old and new weights"
            )
        stale = sabotage.active(sabotage.STALE_SYNC)
        with self._model_lock:  # the version moves with the weights: a batch reads both at its start
            if not stale:
                self.model.load_state_dict(state, strict=False)
            held = self.weight_fingerprint(sent=set(state))
            if global_steps is not None:
                self.global_steps = int(global_steps)
        self.weight_updates += 1
        self._ledger[self.global_steps] = {
            "held": digest(held),
            "sent": digest(sent_fingerprint(state, held)),
        }
        note = " (IGNORED: sabotage stale_sync)" if stale else ""
        line = UPDATE_LINE.format(
            n=self.weight_updates,
            step=self.global_steps,
            tensors=len(state),
            fingerprint=digest(held),
            note=note,
        )
        print(line, flush=True)  # noqa: T201  (Ray forwards it to the run's log)
        return held

    def weight_fingerprint(self, sent: set[str] | None = None) -> dict[str, TensorPrint]:
        """The prints of every weight the model holds, in its own dtype (a tied `lm_head` only if it was sent)."""
        prints = fingerprint(self.model.state_dict().items())
        if getattr(self.model.config, "tie_word_embeddings", False) and "lm_head.weight" not in (
            sent or set()
        ):
            prints.pop("lm_head.weight", None)
        return prints

    def ledger(self) -> dict[int, dict[str, str]]:
        """Per weights version (global_steps of the update): the digest of what the server held after loading it
        and of what it was sent, cast to its dtype. verl's async client keeps only the version numbers of a
        turn (workers/rollout/llm_server.py rebuilds the TokenOutput), so the checks of an async run read each
        trajectory's versions here (trainer/plugins/sampler.py): a version is verified when the two digests agree."""
        return {version: dict(entry) for version, entry in self._ledger.items()}

    def stats(self) -> dict[str, int]:
        return {
            "global_steps": self.global_steps,
            "weight_updates": self.weight_updates,
            "batches": self.batches,
            "sequences": self.sequences,
        }

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        while not self._gate_open:  # paused for a weight update: wait for resume_generation, as vLLM parks
            if self._rejecting:
                return self._output(_Result([], [], "aborted", self._stamp(self.global_steps)))
            await self._resumed.wait()
        prompt = list(prompt_ids)
        budget = turn_budget(self.response_length, self.max_len - len(prompt), sampling_params)
        request = _Request(
            prompt, _sampling(sampling_params), budget, asyncio.get_running_loop().create_future()
        )
        self._pending.append(request)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return self._output(await request.future)

    @staticmethod
    def _stamp(version: int) -> int | None:
        return None if sabotage.active(sabotage.NO_VERSION_STAMPS) else version

    @staticmethod
    def _output(result: _Result) -> TokenOutput:
        """verl's TokenOutput; `global_steps` is the version the turn's tokens were sampled from (the async client
        turns the stamps of a turn's attempts into its min/max_global_steps, the trajectory's version tags)."""
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs,
            stop_reason=result.stop_reason,
            extra_fields={"global_steps": result.version},
        )

    async def _drain(self) -> None:
        """Run the waiting requests in batches (same sampling settings per batch) until none is left."""
        while self._pending:
            await asyncio.sleep(self.gather_s)  # let the turns arriving together join one batch
            if not self._pending:  # abort_all_requests resolved them during the wait
                break
            sampling = self._pending[0].sampling
            batch = [r for r in self._pending if r.sampling == sampling][: self.max_batch]
            taken = {id(r) for r in batch}
            self._pending = [r for r in self._pending if id(r) not in taken]
            await run_batch([r.future for r in batch], partial(self.generate_batch, batch))

    def generate_batch(self, batch: list[_Request]) -> list[_Result]:
        """One left-padded `generate` for the batch: each sequence's tokens, their sampling log-probs, and the
        weights version read under the lock at the start (an update waits for the batch, so all its tokens come
        from that version). `abort_all_requests` stops it after the current token: rows not yet at a stop token
        or their budget come back "aborted" with what they have, which verl's async client resumes later."""
        # OpenMP's thread count is per calling thread: this runs in asyncio's worker thread, which would start at
        # OMP_NUM_THREADS (Ray sets 1 for a 1-CPU actor) and generate on one core (measured: 100% CPU, not 200%)
        torch.set_num_threads(self.threads)
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):
            ids[row, width - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            mask[row, width - len(request.prompt_ids) :] = 1
        temperature, top_p, top_k = batch[0].sampling
        do_sample = temperature > 0
        started = time.perf_counter()
        with self._model_lock, torch.no_grad():
            version = self.global_steps
            out = self.model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max(r.budget for r in batch),
                do_sample=do_sample,
                temperature=temperature if do_sample else None,
                top_p=top_p if do_sample else None,
                top_k=top_k if do_sample and top_k > 0 else None,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.pad_id,
                return_dict_in_generate=True,
                output_logits=True,
                stopping_criteria=StoppingCriteriaList([_StopOnAbort(self._abort)]),
            )
            aborted = self._abort.is_set()
        seconds = time.perf_counter() - started
        new = out.sequences[:, width:]
        log_probs = torch.stack(
            [sampled_log_probs(step, new[:, t], temperature) for t, step in enumerate(out.logits)], dim=1
        )
        self.batches += 1
        self.sequences += len(batch)
        results = []
        for row, request in enumerate(batch):
            tokens = new[row, : request.budget].tolist()
            keep = first_stop(tokens, self.stop_ids)
            cut = aborted and keep == len(tokens) < request.budget  # neither a stop token nor its budget
            results.append(
                _Result(
                    tokens[:keep],
                    log_probs[row, :keep].tolist(),
                    "aborted" if cut else "completed",
                    self._stamp(version),
                )
            )
        kept = sum(len(r.token_ids) for r in results)
        print(BATCH_LINE.format(n=len(batch), tokens=kept, seconds=seconds), flush=True)  # noqa: T201
        return results

    # The control calls verl makes on every rollout server; an in-memory HF model has nothing to free.
    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Pause generation for a weight update (verl's colocate_async `on_sample_end`, replica.py): close the
        gate (new turns park until `resume_generation`, or come back aborted at once with `reject_request`),
        resolve queued turns as aborted with no tokens, and stop the running batch after its current token."""
        self._gate_open = False
        self._rejecting = reject_request
        self._resumed.clear()
        self._abort.set()
        queued, self._pending = self._pending, []
        for request in queued:
            if not request.future.done():
                request.future.set_result(_Result([], [], "aborted", self._stamp(self.global_steps)))

    async def resume_generation(self) -> None:
        """Open the gate again (verl's `on_step_end`, after the update): parked turns go on, on the new weights."""
        self._abort.clear()
        self._rejecting = False
        self._gate_open = True
        self._resumed.set()

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class HFRolloutReplica(RolloutReplica):
    """verl's replica interface over one HFGenerateServer actor."""

    async def launch_servers(self) -> None:
        name = HF_SERVER_NAME.format(rank=self.replica_rank)
        # Any: ray types an actor's methods (`server.ready.remote`) only where @ray.method declares them
        server: Any = (
            ray.remote(HFGenerateServer)
            .options(name=name, num_cpus=1, max_concurrency=self.max_concurrency)
            .remote(
                model_path=self.model_config.get("local_path") or self.model_config.path,
                prompt_length=self.config.prompt_length,
                response_length=self.config.response_length,
                seed=int(getattr(self.config, "seed", 0) or 0),
                dtype=str(hf_engine_kwargs(self.config).get("dtype") or "float32"),
                max_batch=int(hf_engine_kwargs(self.config).get("max_batch") or 32),
                # separate_async: the trainer computes while the server generates; None = every core (sync modes)
                threads=int(hf_engine_kwargs(self.config).get("threads") or 0) or None,
            )
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf-rollout-{self.replica_rank}"


class HFServerAdapter(BaseRollout):
    """The weight receiver's side: pushes each update's weights to its replica's HFGenerateServer.

    Two places build it. Colocated (`sync`, `colocate_async`): verl's training worker, with no `replica_rank`, so
    the replica is `RANK // world` of the trainer group. Standalone (`separate_async`): verl's
    `CheckpointEngineWorker` in the replica's own worker group (checkpoint_engine/base.py:340-349), whose RANK
    restarts at 0 in every replica, so verl passes `replica_rank` (replica.py:234-239) as it does to vLLM's adapter;
    deriving it from RANK there would send every replica's weights to server 0. verl reads `replica_rank` and
    `is_leader_rank` back (base.py:366-374), and its standalone path hands `update_weights` an async generator
    (the checkpoint engine's `receive_weights`).
    """

    def __init__(
        self,
        config: Any,
        model_config: Any,
        device_mesh: Any,
        *args: Any,
        replica_rank: int = -1,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, model_config, device_mesh)
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // world if replica_rank < 0 else int(replica_rank)
        self.is_leader_rank = rank % world == 0
        self._server: Any = None

    def _get_server(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(HF_SERVER_NAME.format(rank=self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout takes full tensors, not {wire_format!r}")
        state = {}
        # colocated: verl's generator of the actor's tensors; standalone: the checkpoint engine's async generator
        stream = ensure_async_iterator(weights)  # type: ignore[no-untyped-call]
        async for name, tensor in stream:
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            state[name] = full.detach().to("cpu", torch.float32).clone()  # exact for bf16 and fp32 sources
        if self.is_leader_rank:
            global_steps = kwargs.get("global_steps")
            held = await self._get_server().update_weights.remote(state, global_steps)
            check_sync(held, sent_fingerprint(state, held), global_steps)
            print(sync_match_line(global_steps, len(state), digest(held)), flush=True)  # noqa: T201  (to the log)


def sent_fingerprint(state: dict[str, torch.Tensor], held: dict[str, TensorPrint]) -> dict[str, TensorPrint]:
    """The prints of the tensors sent, each cast to the dtype the server holds it in (as its load casts it)."""
    return fingerprint(state.items(), lambda name: getattr(torch, held[name].dtype) if name in held else None)


__all__ = [
    "HF_SERVER_NAME",
    "HFGenerateServer",
    "HFRolloutReplica",
    "HFServerAdapter",
    "first_stop",
    "hf_engine_kwargs",
    "missing_weights",
    "sampled_log_probs",
    "sent_fingerprint",
    "turn_budget",
]
