"""The vLLM classes of the weight-sync check (trainer/weight_sync/vllm_sync.py): verl's, each with one mixin. GPU only.

Imported by verl through the names trainer/weight_sync/vllm_sync.py registers (`RolloutReplicaRegistry` "vllm" and
`_ROLLOUT_REGISTRY[("vllm", "async")]`), and by each vLLM worker process through the extension's qualified
name; importing it needs vLLM (verl's vllm_rollout package refuses to import without it).
"""

from __future__ import annotations

from typing import Any

import ray
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

from searchrl.trainer.weight_sync.vllm_sync import (
    FingerprintAdapterMixin,
    FingerprintServerMixin,
    FingerprintWorkerMixin,
)


class SearchRLWorkerExtension(FingerprintWorkerMixin, vLLMColocateWorkerExtension):
    """verl's worker extension plus `weight_fingerprint()`."""


class FingerprintHttpServer(FingerprintServerMixin, vLLMHttpServer):
    """verl's vLLM server with the extension above and a `collective_rpc` that returns the workers' results."""

    def _get_worker_extension_cls(self) -> str:
        return f"{SearchRLWorkerExtension.__module__}.{SearchRLWorkerExtension.__qualname__}"


class FingerprintReplica(vLLMReplica):
    """verl's vLLM replica, launching FingerprintHttpServer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(FingerprintHttpServer)


# verl's BaseRollout.update_weights has no global_steps; its adapters, and the mixin with them, put it second (verl
# passes it by keyword: workers/engine_workers.py)
class FingerprintServerAdapter(FingerprintAdapterMixin, ServerAdapter):  # type: ignore[misc]
    """verl's vLLM adapter that checks the workers' fingerprint after every full update."""


__all__ = [
    "FingerprintHttpServer",
    "FingerprintReplica",
    "FingerprintServerAdapter",
    "SearchRLWorkerExtension",
]
