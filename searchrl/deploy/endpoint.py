"""Is the retrieval service up: its readiness probe as SkyServe sends it, and the wait for its endpoint."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tenacity

from searchrl.deploy.skypilot import _sky
from searchrl.errors import DeployError, first_line

if TYPE_CHECKING:
    import sky

log = logging.getLogger(__name__)

DEFAULT_SERVICE = "searchrl-retrieval"
# How long `searchrl sky endpoint` waits for READY by default: sky/retrieval.yaml's initial_delay_seconds (2000,
# the slowest supported replica start; searchrl/deploy/replica_budget.py) plus ~10 min for the controller and provisioning.
ENDPOINT_TIMEOUT_S = 2600.0


# --- readiness probe --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """A readiness probe as SkyServe sends it (sky/serve/replica_managers.py `ReplicaInfo.probe`)."""

    path: str
    post_data: dict[str, Any] | None
    headers: dict[str, str] | None
    timeout_s: float
    initial_delay_s: float

    @property
    def method(self) -> str:
        return "GET" if self.post_data is None else "POST"


def readiness_probe(task: sky.Task) -> Probe:
    spec = task.service
    if spec is None:
        raise DeployError("task has no service: section, so no readiness probe")
    return Probe(
        path=spec.readiness_path,
        post_data=spec.post_data,
        headers=spec.readiness_headers,
        timeout_s=float(spec.readiness_timeout_seconds),
        initial_delay_s=float(spec.initial_delay_seconds),
    )


def send_probe(base_url: str, probe: Probe) -> tuple[int, str]:
    """Send `probe` to `base_url` the way SkyServe does: `requests` with json=post_data, the headers, a timeout."""
    import requests

    url = base_url.rstrip("/") + probe.path
    try:
        if probe.post_data is not None:
            resp = requests.post(url, json=probe.post_data, headers=probe.headers, timeout=probe.timeout_s)
        else:
            resp = requests.get(url, headers=probe.headers, timeout=probe.timeout_s)
    except requests.RequestException as exc:
        raise DeployError(f"probe {probe.method} {url}: unreachable ({type(exc).__name__})") from None
    return resp.status_code, resp.text[:300]


# --- endpoint ---------------------------------------------------------------------------------------------------
# SkyServe 0.14.1 (sky/serve/serve_state.py, serve_utils.set_service_status_and_active_versions_from_replica)
# derives the service status from the READY replicas only: until one replica is READY it reads NO_REPLICA
# (REPLICA_INIT is never set, and failed replicas never make it FAILED). So NO_REPLICA means "starting" and a
# failure is read from each replica's own status in `replica_info`.
_SERVICE_PENDING = frozenset({"CONTROLLER_INIT", "REPLICA_INIT", "NO_REPLICA"})
_SERVICE_TERMINAL = frozenset({"CONTROLLER_FAILED", "FAILED_CLEANUP", "SHUTTING_DOWN", "FAILED"})
# SkyServe 0.14.1's `ReplicaStatus.failed_statuses()`, used when SkyPilot is not importable (tests of the pure
# logic); with SkyPilot the installed package's own list is used. PREEMPTED and NOT_READY are not failures:
# SkyServe replaces a preempted replica, and a NOT_READY one may recover.
_REPLICA_FAILED_0_14_1 = frozenset(
    {"FAILED", "FAILED_CLEANUP", "FAILED_INITIAL_DELAY", "FAILED_PROBING", "FAILED_PROVISION", "UNKNOWN"}
)
# The states after which SkyServe's autoscaler stops launching replicas: `ReplicaStatusProperty.
# unrecoverable_failure()` (the app failed, or the initial delay ran out, on a replica never READY), checked by
# `autoscalers._generate_scaling_decisions` only while the service's version has never had a READY replica. Once
# one was READY (the service's `uptime` is set, sky/serve/replica_managers.py `_probe_all_replicas`), SkyServe
# replaces every failed replica, so these are fatal only before that.
_REPLICA_FATAL = frozenset({"FAILED", "FAILED_INITIAL_DELAY"})
# FAILED_CLEANUP is not an outcome while SkyServe syncs a failed replica's logs: `_terminate_replica(sync_down_
# logs=True)` downloads them before it sets sky_down_status, and `to_replica_status()` reads FAILED_CLEANUP for a
# replica whose app or launch failed and whose sky.down has not started. It then goes SHUTTING_DOWN and ends as
# FAILED or FAILED_PROVISION. Only a replica whose sky.down failed stays FAILED_CLEANUP (a possible leak), so
# the wait ends on FAILED_CLEANUP only when it lasts longer than the log sync can.
CLEANUP_GRACE_S = 900.0
# Failed replicas SkyServe replaces that end the wait; counted only since the service last had a READY replica
# and only for its current version (failed records stay in SkyServe's replica table for the service's life).
MAX_REPLACED_REPLICAS = 3
# Consecutive status reads that may fail (API server restarting, a network blip) before the wait gives up.
MAX_STATUS_ERRORS = 5
_REPLICA_HINT = {
    "FAILED": "its setup or run exited non-zero",
    "FAILED_CLEANUP": f"SkyServe could not tear it down ({CLEANUP_GRACE_S:.0f}s in FAILED_CLEANUP): check the "
    "cloud console for a leaked cluster and `sky serve down` the service",
    "FAILED_INITIAL_DELAY": "it did not pass the readiness probe within initial_delay_seconds (setup + index "
    "load took longer: raise service.readiness_probe.initial_delay_seconds, docs/deploy.md)",
    "FAILED_PROBING": "it stopped answering the readiness probe",
    "FAILED_PROVISION": "no cloud could provision it (quota, capacity or resources)",
    "UNKNOWN": "SkyServe lost track of it",
}


def service_records(name: str) -> list[dict[str, Any]]:
    """`sky.get(sky.serve.status(name))`: one dict per service with `status`, `endpoint` and `replica_info`."""
    sky = _sky()
    try:
        return list(sky.get(sky.serve.status(name)))
    except Exception as exc:  # the API server may be down or restarting: the wait retries, then gives up
        raise DeployError(
            f"cannot read the status of service {name!r}: {first_line(exc)} (check `sky api status` and `sky check`)"
        ) from None


def _status_name(status: Any) -> str:
    return str(getattr(status, "value", status)).upper()


def failed_replica_states() -> frozenset[str]:
    """Replica states SkyServe counts as failed: from the installed SkyPilot when there is one."""
    try:
        from sky.serve.serve_state import ReplicaStatus
    except ImportError:
        return _REPLICA_FAILED_0_14_1
    return frozenset(s.value for s in ReplicaStatus.failed_statuses())


def _replica_states(record: Mapping[str, Any]) -> list[tuple[Any, str]]:
    """(replica_id, STATUS) for every replica SkyServe reports (launched, starting, ready, failed...)."""
    return [
        (info.get("replica_id", "?"), _status_name(info.get("status")))
        for info in record.get("replica_info") or []
    ]


def _outdated_replicas(record: Mapping[str, Any]) -> set[Any]:
    """Ids of replicas of an older version than the service's (`sky serve update` replaced them)."""
    version = record.get("version")
    if not isinstance(version, int):
        return set()
    return {
        info.get("replica_id", "?")
        for info in record.get("replica_info") or []
        if isinstance(info.get("version"), int) and info["version"] < version
    }


def _summary(replicas: Sequence[tuple[Any, str]]) -> str:
    if not replicas:
        return "no replicas yet"
    counts: dict[str, int] = {}
    for _, status in replicas:
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def _read_status(
    name: str,
    status_fn: Callable[[str], list[dict[str, Any]]],
    sleep: Callable[[float], None],
    interval_s: float,
) -> list[dict[str, Any]]:
    """One status read, retried: a single failed API call must not end a wait of ~40 minutes."""
    for attempt in tenacity.Retrying(
        stop=tenacity.stop_after_attempt(MAX_STATUS_ERRORS),
        wait=tenacity.wait_fixed(interval_s),
        retry=tenacity.retry_if_exception_type(DeployError),
        sleep=sleep,
        reraise=True,
        before_sleep=lambda state: log.warning(
            "service %s: status read %d of %d failed (%s); retrying",
            name,
            state.attempt_number,
            MAX_STATUS_ERRORS,
            state.outcome.exception() if state.outcome else "?",
        ),
    ):
        with attempt:
            return status_fn(name)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


def _fail(name: str, rid: Any, state: str, prefix: str = "") -> DeployError:
    return DeployError(
        f"service {name!r}: {prefix}replica {rid} is {state}: {_REPLICA_HINT.get(state, 'it failed')}; its log: "
        f"`sky serve logs {name} {rid}` (controller: `sky serve logs --controller {name}`)"
    )


@dataclass
class _FailureWatch:
    """What the wait remembers between status reads to tell a failure that ends it from one SkyServe repairs."""

    name: str
    failed_states: frozenset[str]
    history: set[Any] = field(default_factory=set)  # failed before the service last had a READY replica
    counted: dict[Any, str] = field(
        default_factory=dict
    )  # replica id -> failed state, for failures since then
    cleanup_since: dict[Any, float] = field(default_factory=dict)  # replica id -> first seen FAILED_CLEANUP
    ever_ready: bool = False

    def observe(self, record: Mapping[str, Any], replicas: Sequence[tuple[Any, str]], now: float) -> None:
        """Take in one status read: raise the DeployError that ends the wait, or log what failed since the last."""
        outdated = _outdated_replicas(record)
        failed = [(rid, st) for rid, st in replicas if st in self.failed_states and rid not in outdated]
        self._note_ready(record, replicas, failed)
        self._track_cleanup(replicas, now)
        # FAILED_CLEANUP is not counted until it becomes an outcome (or outlasts the grace, below)
        current = [(rid, st) for rid, st in failed if rid not in self.history and st != "FAILED_CLEANUP"]
        new = [(rid, st) for rid, st in current if self.counted.get(rid) != st]
        self.counted.update(current)
        self._raise_if_over(current, outdated, now)
        self._log_new(new, now)

    def _note_ready(
        self, record: Mapping[str, Any], replicas: Sequence[tuple[Any, str]], failed: list[tuple[Any, str]]
    ) -> None:
        if any(st == "READY" for _, st in replicas) or (
            record.get("uptime") is not None and not self.ever_ready
        ):
            # A replica is READY now, or was since the service's first probe success (`uptime`): what failed
            # until then is history SkyServe has replaced, and its autoscaler no longer stops on a failure.
            self.history.update(rid for rid, _ in failed)
            self.counted.clear()
            self.ever_ready = True

    def _track_cleanup(self, replicas: Sequence[tuple[Any, str]], now: float) -> None:
        for rid, st in replicas:
            if st == "FAILED_CLEANUP":
                self.cleanup_since.setdefault(rid, now)
            else:
                self.cleanup_since.pop(rid, None)

    def _raise_if_over(self, current: list[tuple[Any, str]], outdated: set[Any], now: float) -> None:
        """End the wait on a stuck FAILED_CLEANUP, a fatal failure before READY, or too many replacements."""
        stuck = [
            rid
            for rid, since in self.cleanup_since.items()
            if rid not in self.history and rid not in outdated and now - since >= CLEANUP_GRACE_S
        ]
        if stuck:
            raise _fail(self.name, stuck[0], "FAILED_CLEANUP")
        fatal = [] if self.ever_ready else [(rid, st) for rid, st in current if st in _REPLICA_FATAL]
        if fatal:
            raise _fail(self.name, *fatal[0])
        if len(self.counted) >= MAX_REPLACED_REPLICAS:
            rid, st = list(self.counted.items())[-1]
            raise _fail(self.name, rid, st, f"{len(self.counted)} replicas failed, the last: ")

    def _log_new(self, new: list[tuple[Any, str]], now: float) -> None:
        name = self.name
        for rid, since in self.cleanup_since.items():
            if since == now and rid not in self.history:  # first seen in FAILED_CLEANUP
                log.warning(
                    "service %s: replica %s is FAILED_CLEANUP: SkyServe syncs its logs before tearing it down; "
                    "waiting for its final state (`sky serve logs %s %s`)",
                    name,
                    rid,
                    name,
                    rid,
                )
        for rid, st in new:
            log.warning(
                "service %s: replica %s is %s (%s); %s",
                name,
                rid,
                st,
                _REPLICA_HINT.get(st, "it failed"),
                "SkyServe launches a replacement"
                if st not in _REPLICA_FATAL
                else "SkyServe replaces it (READY before)",
            )


def _service_record(
    name: str,
    status_fn: Callable[[str], list[dict[str, Any]]],
    sleep: Callable[[float], None],
    interval_s: float,
) -> dict[str, Any]:
    """The service's one status record; a service SkyServe does not know ends the wait with how to start it."""
    records = _read_status(name, status_fn, sleep, interval_s)
    if not records:
        raise DeployError(
            f"no service named {name!r}: start it with "
            f"`sky serve up -n {name} sky/retrieval.yaml --secret RETRIEVAL_API_KEY`"
        )
    return records[0]


def _check_service_status(name: str, status: str, replicas: Sequence[tuple[Any, str]]) -> None:
    """A service status that is neither pending nor READY (failed, shutting down, unknown) ends the wait."""
    if status in _SERVICE_TERMINAL or status not in _SERVICE_PENDING | {"READY"}:
        raise DeployError(
            f"service {name!r} is {status} ({_summary(replicas)}): see `sky serve status {name}` and "
            f"`sky serve logs --controller {name}`"
        )


def wait_for_endpoint(
    name: str,
    *,
    timeout_s: float = ENDPOINT_TIMEOUT_S,
    interval_s: float = 10.0,
    status_fn: Callable[[str], list[dict[str, Any]]] = service_records,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Poll SkyServe until service `name` is READY with an endpoint, and return it as http://IP:PORT.

    Pending while the service reads CONTROLLER_INIT/NO_REPLICA/REPLICA_INIT. Until the service has had a READY
    replica, one in a state after which SkyServe stops scaling (FAILED, FAILED_INITIAL_DELAY) ends the wait with
    one line naming it, its state and the command that shows its log. A replica SkyServe replaces (FAILED_
    PROVISION, FAILED_PROBING, ..., and any failure once the service was READY) is logged, and MAX_REPLACED_
    REPLICAS of those since the last READY replica end it too. FAILED_CLEANUP ends it only after CLEANUP_GRACE_S
    (the log sync before teardown reads FAILED_CLEANUP too). A failed status read is retried MAX_STATUS_ERRORS
    times, `interval_s` apart.
    """
    start = clock()
    deadline = start + timeout_s
    watch = _FailureWatch(name, failed_replica_states())
    while True:
        record = _service_record(name, status_fn, sleep, interval_s)
        status = _status_name(record.get("status"))
        replicas = _replica_states(record)
        endpoint = record.get("endpoint")
        if status == "READY" and endpoint:
            endpoint = str(endpoint)
            return endpoint if "://" in endpoint else f"http://{endpoint}"
        watch.observe(record, replicas, clock())
        _check_service_status(name, status, replicas)
        waited = clock() - start
        if clock() + interval_s > deadline:
            raise DeployError(
                f"service {name!r} not READY after {timeout_s:.0f}s (last status {status}; "
                f"replicas: {_summary(replicas)}); see `sky serve status {name}`"
            )
        log.info(
            "service %s is %s; replicas: %s; waited %.0fs of %.0fs",
            name,
            status,
            _summary(replicas),
            waited,
            timeout_s,
        )
        sleep(interval_s)
