"""A stand-in for `python -m sglang.launch_server` (no GPU here): same flags, scripted OpenAI endpoints.

Copies the interface of sglang 0.5.12 (the version sky/infer.yaml and requirements/gpu-infer-py311.txt pin):
`sglang/launch_server.py` with `srt/server_args.py`'s `--model-path/--host/--port` and any other flag, and the
OpenAI routes of `srt/entrypoints/http_server.py`. tests/infer/test_sglang.py checks the flags the launcher adds
against that version's own parser, read from its wheel.

    python tests/infer/fake_sglang.py --model-path NAME --host 127.0.0.1 --port 30000 [any sglang flags]

Serves tests/infer/scripted_llm.py's app (`GET /health`, `/v1/models`, `/v1/completions`, chat) with the
TRAINED script of tests/infer/test_agent.py under the model name it was started with, after a short start-up
delay, so the launcher's health wait is exercised. FAKE_SGLANG_FAIL=1 makes it exit with an error first, as a
CUDA out-of-memory at load would.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: make `tests` importable


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    args, extra = parser.parse_known_args()
    print(f"fake sglang: model {args.model_path}, extra flags {extra}", flush=True)  # noqa: T201
    if os.environ.get("FAKE_SGLANG_FAIL"):
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)  # noqa: T201
        sys.exit(1)
    time.sleep(1.5)  # loading weights

    import uvicorn

    from tests.infer.scripted_llm import create_scripted_app
    from tests.infer.test_agent import TRAINED

    uvicorn.run(
        create_scripted_app({args.model_path: TRAINED}), host=args.host, port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
