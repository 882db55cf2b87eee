"""The one exception hierarchy of searchrl.

    SearchRLError
    ├── ConfigError(ValueError)        bad settings, flags or environment; the message names the knob
    ├── CorpusError                    unreadable or malformed corpus file (message gives path:line)
    ├── IndexLoadError                 index directory missing, corrupt, or not matching corpus/encoder
    ├── BackendError                   a retrieval backend failed to answer (upstream error, quota, ...)
    │   ├── QuotaExceededError         a web backend's request budget is spent (HTTP 429)
    │   ├── CacheMissError             replay mode and the query was never recorded (HTTP 404: no retry helps)
    │   └── PageFetchError             web page mode refused or could not read a result page (`reason` label)
    ├── RetrievalUnavailableError      /retrieve unreachable, timed out, or answered with an error
    │   ├── SearchFailureRateError     too many failed searches during training: the run stops (trainer/plugins/reward.py)
    │   ├── ServiceUnavailableError    an outage (refused, timed out, 5xx/429) until the deadline: exit 75, not 2
    │   └── FatalSearchError           an eval search failure no later search can fix (401, 403, 404, 429, dead)
    ├── OverloadedError                the service is past its queue bound (HTTP 503 + Retry-After)
    ├── DataError                      QA data or training data that cannot be prepared
    ├── CheckpointError                checkpoint missing or merge output not loadable
    ├── RolloutFailedError             a rollout group failed inside verl's agent-loop worker: training stops
    ├── SmokeCheckError                a smoke run exited 0 but did not search, checkpoint or merge
    ├── StepCheckError                 a training step failed a check (loss mask, weight sync, a missing metric): verl stopped
    ├── DeployError                    SkyPilot task invalid, endpoint not ready, launch failed
    ├── InferenceError                 the LLM server (or local model) cannot be reached, loaded or parsed
    │   └── RequestRejectedError       the LLM server refused one request (4xx): recorded, the run goes on
    ├── InvalidRunError                an eval finished with too many failed questions for its numbers to count
    ├── RunCannotBeValidError          an eval stops early: its failures already make the run invalid
    ├── RetryableError                 one HTTP attempt failed in a way a retry may fix (searchrl/http.py)
    │   └── RetryableRetrievalError(RetrievalUnavailableError)  a /retrieve attempt worth another one
    └── ModelGetError                  a known model (`searchrl model get`) cannot be installed or converted

`searchrl.cli.main()` catches `SearchRLError` only: it prints `error: <message>` as one line on stderr and exits
with the error's `exit_code`: 2 (a refusal: fixing the input fixes it), except ServiceUnavailableError's 75
(EX_TEMPFAIL: the same command may pass later; trainer/node/refusal.py never counts it as a refusal). Anything else
is a bug and keeps its traceback. Messages say what is wrong and how to fix it, and never contain a secret.

Every exception class lives here (tests/test_errors.py checks the tree above against the classes), except
trainer/node/nvidia_driver.py's `DriverError`, trainer/node/stack_check.py's `StackError` and trainer/cpu/vllm_env.py's
`WheelError`, which never leave their modules: those files run as scripts before this package is importable
(nvidia_driver.py on the nodes with the system python, vllm_env.py before the vLLM CPU venv exists), and
trainer/lockfiles.py and trainer/launch.py turn the first two into ConfigError; vllm_env.py prints its one line and
exits 2 itself.
"""

from __future__ import annotations


class SearchRLError(Exception):
    """Base class of every error searchrl raises on purpose."""

    exit_code = 2  # what `searchrl` exits with: argparse's usage-error code


class ConfigError(SearchRLError, ValueError):
    """A setting, flag or environment variable has a bad value or combination."""


class CorpusError(SearchRLError):
    """A corpus file cannot be read, or a row is not Search-R1 JSONL."""


class IndexLoadError(SearchRLError):
    """An index directory is missing, corrupt, or does not match the corpus or encoder."""


class BackendError(SearchRLError):
    """A retrieval backend failed to produce results."""


class QuotaExceededError(BackendError):
    """A web backend's configured request budget is spent."""


class CacheMissError(BackendError):
    """Replay mode was asked a query that was never recorded."""


class PageFetchError(BackendError):
    """A page was refused or could not be read; `reason` is one of retrieval/backends/web/pages.py's `REASONS` (the
    metric label)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RetrievalUnavailableError(SearchRLError):
    """The retrieval service could not be reached or answered with an error."""

    def __init__(self, message: str, *, kind: str = "error", status: int | None = None) -> None:
        super().__init__(message)
        # kind is a short machine-readable label ("timeout", "connect", "http_401", ...) used for metrics.
        self.kind = kind
        self.status = status


class ServiceUnavailableError(RetrievalUnavailableError):
    """The service did not answer at all until the deadline (unreachable, timed out, 5xx, 429): an outage, e.g.
    SkyServe's load balancer answering 503 while its only replica is replaced. Not a refusal: waiting or a restart
    can fix it, so it exits 75 (sysexits EX_TEMPFAIL) and a managed job restarts instead of stopping."""

    exit_code = 75


class SearchFailureRateError(RetrievalUnavailableError):
    """Too large a share of a training run's recent searches failed; training stops instead of learning it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="failure_rate")


class FatalSearchError(RetrievalUnavailableError):
    """A search failure that ends an eval run: every later search would fail the same way (infer/agent.py)."""


class OverloadedError(SearchRLError):
    """The service's queue is full; the client should retry after `retry_after` seconds."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DataError(SearchRLError):
    """QA or training data that cannot be prepared."""


class CheckpointError(SearchRLError):
    """A checkpoint is missing, or a merged model does not load."""


class RolloutFailedError(SearchRLError):
    """A rollout group failed inside verl's agent-loop worker (a raising reward or tool): training stops."""


class SmokeCheckError(SearchRLError):
    """A smoke training run finished but missed what a real run needs (a search, a checkpoint, a merge)."""


class StepCheckError(SearchRLError):
    """A training step failed a check, so training stops rather than go on for hours past a known bug: raised by
    `searchrl train local` at a step line (tool responses in the loss, a search with no tool-response token seen,
    a check metric verl did not log), which stops verl there, or inside verl at a weight sync whose fingerprint
    the rollout does not hold (the hf and vLLM rollouts; sglang has no such check)."""


class DeployError(SearchRLError):
    """A SkyPilot task is invalid, an endpoint never became ready, or a launch failed."""


class InferenceError(SearchRLError):
    """The LLM server could not be reached or answered with an error, or a local model failed to load."""


class RequestRejectedError(InferenceError):
    """The LLM server refused one request (4xx, e.g. the prompt is longer than the context window).

    The agent records it on that question and goes on; other failures abort the run.
    """

    def __init__(self, message: str, *, status: int = 400, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class InvalidRunError(SearchRLError):
    """The eval run finished, but too many of its questions failed for its numbers to be quoted."""


class RunCannotBeValidError(SearchRLError):
    """Raised while an eval runs once failures make the run invalid whatever the remaining questions give."""


class ModelGetError(SearchRLError):
    """A known model could not be installed, found or converted (searchrl/models.py)."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), for a one-line error: library errors
    (SkyPilot's, huggingface_hub's, transformers') span many lines of tables and hints."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- HTTP retries (searchrl/http.py) ------------------------------------------------------------------------
class RetryableError(SearchRLError):
    """One HTTP attempt failed in a way another attempt may fix (refused, timed out, 429, 5xx): exactly what
    `searchrl.http.retrying` retries. `retry_after`: the server's Retry-After in seconds, if it sent one;
    `error`: what to raise once no attempt is left (None: this error itself)."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        error: SearchRLError | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(message, **kwargs)  # kwargs: e.g. kind/status of the mixin below
        self.retry_after = retry_after
        self.error = error


class RetryableRetrievalError(RetryableError, RetrievalUnavailableError):
    """A /retrieve attempt worth another one: the retrieval client's retryable kinds (connect, timeout, pool,
    429, 5xx). Still a RetrievalUnavailableError, with its `kind` and `status`, for metrics and the breaker."""


__all__ = [
    "first_line",
    "BackendError",
    "CacheMissError",
    "CheckpointError",
    "ConfigError",
    "CorpusError",
    "DataError",
    "DeployError",
    "FatalSearchError",
    "IndexLoadError",
    "InferenceError",
    "InvalidRunError",
    "ModelGetError",
    "OverloadedError",
    "PageFetchError",
    "QuotaExceededError",
    "RequestRejectedError",
    "RetrievalUnavailableError",
    "RetryableError",
    "RetryableRetrievalError",
    "ServiceUnavailableError",
    "RolloutFailedError",
    "RunCannotBeValidError",
    "SearchFailureRateError",
    "SearchRLError",
    "SmokeCheckError",
    "StepCheckError",
]  # the tree, plus first_line for building messages (tests/test_errors.py checks both)
