"""The sglang class of the weight-sync check (trainer/weight_sync/sglang_sync.py): verl's adapter with the mixin. GPU only.

Imported by verl through the name trainer/weight_sync/sglang_sync.py registers (`_ROLLOUT_REGISTRY[("sglang", "async")]`);
importing it needs sglang (verl's sglang_rollout module imports it at the top). The server side needs nothing of
ours: the read-back goes through sglang's own `/get_weights_by_name` on the server verl already launches.
"""

from __future__ import annotations

from verl.workers.rollout.sglang_rollout.sglang_rollout import ServerAdapter

from searchrl.trainer.weight_sync.sglang_sync import SglangFingerprintMixin


# verl's BaseRollout.update_weights has no global_steps; its adapters, and the mixin with them, put it second (verl
# passes it by keyword: workers/engine_workers.py)
class FingerprintServerAdapter(SglangFingerprintMixin, ServerAdapter):  # type: ignore[misc]
    """verl's sglang adapter that reads back and compares a block of every tensor after each full update."""


__all__ = ["FingerprintServerAdapter"]
