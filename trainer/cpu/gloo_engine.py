"""A gloo checkpoint engine: verl's trainer-to-rollout weight transfer for CPU runs of `separate_async` (issue 40).

verl 0.9.1's `separate_async` trainer pushes the actor's weights to standalone rollout replicas through a
checkpoint engine (checkpoint_engine/base.py: `CheckpointEngineManager.update_weights`) and refuses the in-process
"naive" one (trainer/ppo/v1/trainer_separate_async.py:68-70); every engine verl ships needs an accelerator (NCCL
and NIXL need cupy, HCCL an NPU). This one broadcasts over gloo, so the mode runs on CPU. It is registered as
"gloo" in verl's `CheckpointEngineRegistry`; verl imports this module in the driver, every actor worker and every
standalone rollout worker when a run sets

    actor_rollout_ref.rollout.checkpoint_engine.backend=gloo
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=searchrl.trainer.cpu.gloo_engine

Topology as verl's NCCL engine with one sender: actor rank 0 sends, the other actor ranks sit out (rank -1) and
rollout workers 1..N receive. The group is a standalone `ProcessGroupGloo` on its own `TCPStore`, never the
default group: every process already has one (the actor's FSDP group, the rollout worker's own, base.py:351), and
Ray's gloo collective would initialise the default group. It is built before and dropped after every sync, as the
manager calls `prepare` / `init_process_group` / `finalize` around each one (replicas may come and go).

Wire format, per bucket of at most `bucket_size` bytes (verl's `split_weight_chunks` cuts a tensor larger than a
bucket into chunks, `merge_weight_chunks` joins them): a broadcast of two int64 (metadata length, payload length),
the pickled metadata (the chunks' `TensorMeta`, `is_last`) and the payload bytes. The last bucket's metadata also
carries the sender's fingerprint of every tensor it sent (trainer/weight_sync/fingerprint.py); the receiver prints what
it reassembled and a difference raises StepCheckError with one line, so a broken transport stops the run instead
of silently training on a rollout that holds other weights. (The hf adapter then checks the load into the server
the same way: two checks, transport and load.) Metadata is pickled, as NCCL's engine does over ZMQ: the peers are
the run's own processes.
"""

from __future__ import annotations

import asyncio
import datetime
import pickle
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)
from verl.workers.rollout.utils import ensure_async_iterator

from searchrl.errors import StepCheckError
from searchrl.trainer.weight_sync.fingerprint import TensorPrint, differences, digest, tensor_print

BACKEND = "gloo"
MODULE = __name__
# verl's default bucket is 2048 MB (rollout.yaml:296), sized for GPU copies; on CPU a bucket is a host buffer.
DEFAULT_BUCKET_MB = 64


def host_address() -> str:
    """This node's address for the TCPStore: Ray's view of it inside a run, loopback outside one (tests)."""
    import ray

    if not ray.is_initialized():
        return "127.0.0.1"
    return str(ray.util.get_node_ip_address()).strip("[]")  # type: ignore[no-untyped-call]


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """verl's checkpoint-engine interface over a standalone gloo process group (see the module docstring).

    Args:
        bucket_size: bytes per broadcast (verl passes `update_weights_bucket_megabytes << 20`).
        is_master: actor rank 0 (verl passes it on the actor side only): it hosts the TCPStore and sends.
        timeout_s: how long a collective waits for its peers before gloo raises.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0) -> None:
        if bucket_size <= 0:
            raise ValueError(f"bucket_size must be positive, got {bucket_size}")
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.rank: int | None = None
        self.world_size: int | None = None
        self._address: dict[str, Any] | None = None
        self._store: Any = None  # torch.distributed.TCPStore (not in torch's stubs)
        self._group: dist.ProcessGroupGloo | None = None
        self._send_buf: torch.Tensor | None = None
        self._sent: dict[str, TensorPrint] = {}  # the sender's prints, from the last bucket received

    # ---- topology (verl's manager: prepare on all -> build_topology -> init_process_group on all) ----------------

    def prepare(self) -> dict[str, Any]:
        """The master opens the TCPStore now, on a port the OS picks and it keeps, and publishes that address; the
        others have nothing to publish.

        Not "pick a free port, bind it later" (verl's `get_free_port`): the port is free only when asked, and the
        manager binds it after a round trip to every worker, once per sync. Two separate_async CPU runs started
        together lost that race in the first invocation (`DistNetworkError ... EADDRINUSE` at
        `init_process_group`); a store listening from the start cannot lose it.
        """
        if not self.is_master:
            return {}
        host = host_address()
        self._store = dist.TCPStore(  # type: ignore[attr-defined]
            host, 0, None, is_master=True, timeout=self.timeout, wait_for_workers=False
        )
        self._address = {"host": host, "port": int(self._store.port)}
        return {"master": dict(self._address)}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict[str, Any]]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Actor rank 0 -> group rank 0, other actor ranks -1 (sit out), rollout workers -> 1..N."""
        master = metadata[0].get("master") if metadata else None
        if not master:
            raise ValueError("gloo checkpoint engine: actor rank 0 must be the master (is_master=True)")
        world_size = 1 + rollout_world_size
        actor_kwargs: dict[str, list[Any]] = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "master_metadata": [master] * actor_wg_world_size,
        }
        rollout_kwargs: dict[str, list[Any]] = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "master_metadata": [master] * rollout_world_size,
        }
        return actor_kwargs, rollout_kwargs

    def init_process_group(self, rank: int, world_size: int, master_metadata: dict[str, Any]) -> None:  # type: ignore[override]
        """Join the standalone group (blocks until every member has joined; verl calls all ranks at once)."""
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        if rank == 0:
            if self._store is None:
                raise RuntimeError("gloo checkpoint engine: the master joins only after its own prepare()")
        else:
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                master_metadata["host"],
                int(master_metadata["port"]),
                world_size,
                is_master=False,
                timeout=self.timeout,
            )
        self._group = dist.ProcessGroupGloo(self._store, rank, world_size, self.timeout)

    def finalize(self) -> None:
        """Drop the group, its store and the send buffer; the next sync builds them again."""
        self._group = None
        self._store = None
        self._send_buf = None
        self._address = None

    # ---- transfer ------------------------------------------------------------------------------------------------

    def _broadcast(self, tensor: torch.Tensor) -> None:
        assert self._group is not None, "init_process_group first"
        self._group.broadcast(tensor, 0).wait()  # type: ignore[attr-defined]  # the binding; the list form fails

    async def _send_bucket(self, payload: torch.Tensor, meta: dict[str, Any]) -> None:
        blob = torch.frombuffer(bytearray(pickle.dumps(meta)), dtype=torch.uint8)
        header = torch.tensor([blob.numel(), payload.numel()], dtype=torch.int64)

        def send() -> None:
            self._broadcast(header)
            self._broadcast(blob)
            if payload.numel():
                self._broadcast(payload)

        await asyncio.to_thread(send)  # the worker's method is async: keep its event loop free

    @torch.no_grad()
    async def send_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]] | AsyncIterator[tuple[str, torch.Tensor]],
        global_steps: int | None = None,
    ) -> dict[str, float]:
        """Broadcast every weight from actor rank 0; the other actor ranks walk the stream (each item is a gather)."""
        if self.rank is None or self.rank > 0:
            raise RuntimeError(
                f"gloo checkpoint engine: send_weights on group rank {self.rank} (only actor ranks send)"
            )
        if self.rank < 0:
            async for _ in ensure_async_iterator(weights):  # type: ignore[no-untyped-call]
                pass
            return {}
        start = time.perf_counter()
        if self._send_buf is None:
            self._send_buf = torch.empty(self.bucket_size, dtype=torch.uint8)
        sent: dict[str, TensorPrint] = {}
        bucket: list[TensorMeta] = []
        offset = total = 0

        async def printed() -> AsyncGenerator[tuple[str, torch.Tensor], None]:
            async for name, tensor in ensure_async_iterator(weights):  # type: ignore[no-untyped-call]
                full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
                full = full.detach().contiguous()
                if name in sent:
                    raise ValueError(f"weight {name!r} appears twice in one update")
                sent[name] = tensor_print(full)
                yield name, full

        async for meta, chunk in split_weight_chunks(printed(), self.bucket_size):  # type: ignore[arg-type]
            assert chunk is not None
            if offset + meta.chunk_size > self.bucket_size:
                await self._send_bucket(self._send_buf[:offset], {"bucket_meta": bucket, "is_last": False})
                bucket, offset = [], 0
            meta.offset = offset
            bucket.append(meta)
            self._send_buf[offset : offset + meta.chunk_size] = chunk
            offset += meta.chunk_size
            total += meta.chunk_size
        last = {"bucket_meta": bucket, "is_last": True, "prints": sent, "global_steps": global_steps}
        await self._send_bucket(self._send_buf[:offset], last)
        seconds = time.perf_counter() - start
        return {"checkpoint_engine/gloo_bytes": float(total), "checkpoint_engine/gloo_send_s": seconds}

    async def _receive_chunks(self) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        """Each bucket's chunks; sets `self._sent` from the last bucket. A fresh buffer per bucket: the tensors
        verl's merge yields for small weights are views of it, and the consumer may hold them past the next one."""

        def receive() -> tuple[dict[str, Any], torch.Tensor]:
            header = torch.zeros(2, dtype=torch.int64)
            self._broadcast(header)
            blob = torch.empty(int(header[0]), dtype=torch.uint8)
            self._broadcast(blob)
            payload = torch.empty(int(header[1]), dtype=torch.uint8)
            if payload.numel():
                self._broadcast(payload)
            return pickle.loads(blob.numpy().tobytes()), payload

        while True:
            meta, payload = await asyncio.to_thread(receive)
            for tensor_meta in meta["bucket_meta"]:
                yield tensor_meta, payload[tensor_meta.offset : tensor_meta.offset + tensor_meta.chunk_size]
            if meta["is_last"]:
                self._sent = meta["prints"]
                return

    @torch.no_grad()
    async def receive_weights(  # type: ignore[override]  # verl types it as a coroutine
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Yield `(name, tensor)` as verl's adapters expect; after the last, check the transport (StepCheckError)."""
        if self.rank is None or self.rank < 1:
            raise RuntimeError(
                f"gloo checkpoint engine: receive_weights on group rank {self.rank} (rollout ranks are >= 1)"
            )
        self._sent = {}
        received: dict[str, TensorPrint] = {}
        async for name, tensor in merge_weight_chunks(self._receive_chunks(), self.bucket_size):  # type: ignore[arg-type]
            received[name] = tensor_print(tensor)
            yield name, tensor
        check_transport(received, self._sent, global_steps)


def check_transport(
    received: dict[str, TensorPrint], sent: dict[str, TensorPrint], global_steps: int | None
) -> None:
    """One line when what the rollout worker reassembled is not what actor rank 0 sent."""
    diff = differences(received, sent)
    if diff:
        raise StepCheckError(
            f"gloo checkpoint engine: weights received for step {int(global_steps or 0) + 1} differ from what the "
            f"trainer sent (received {digest(received)}, sent {digest(sent)}; {len(diff)} of "
            f"{len(set(received) | set(sent))} tensors differ, first: {diff[0]})"
        )


def engine_overrides(bucket_mb: int = DEFAULT_BUCKET_MB) -> list[str]:
    """The verl Hydra overrides that select this engine (the separate_async CPU run passes them)."""
    prefix = "actor_rollout_ref.rollout.checkpoint_engine"
    return [
        f"{prefix}.backend={BACKEND}",
        f"{prefix}.custom_backend_module={MODULE}",
        f"{prefix}.update_weights_bucket_megabytes={bucket_mb}",
    ]


__all__ = [
    "BACKEND",
    "DEFAULT_BUCKET_MB",
    "MODULE",
    "GlooCheckpointEngine",
    "check_transport",
    "engine_overrides",
]
