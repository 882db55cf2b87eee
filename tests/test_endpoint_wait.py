"""The endpoint wait (`searchrl.deploy.endpoint.wait_for_endpoint`) against SkyServe 0.14.1's own replica objects.

Replicas are SkyServe's `ReplicaInfo`, moved through the `ReplicaStatusProperty` fields in the order the replica
manager sets them (sky/serve/replica_managers.py): a failed app or launch first reads FAILED_CLEANUP while
`_terminate_replica(sync_down_logs=True)` downloads its logs (sky_down_status still None), then SHUTTING_DOWN,
then its final state. Records carry `to_info_dict()` as `sky serve status` sends it, the service's `uptime` (set
at the first passed probe) and `version`; a fresh service's first read finds the controller VM still coming up
(CONTROLLER_INIT). The script runs with SkyPilot's python; the wait is our code. Each scenario runs once, however
many tests read it.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from searchrl.deploy import endpoint
from searchrl.errors import DeployError
from tests.sky_code import sky_json

REPLAY = r"""
import json, logging, sys
from sky.serve import serve_state
from sky.serve.replica_managers import ReplicaInfo
from sky.utils.common_utils import ProcessStatus as P
from searchrl.deploy import endpoint
from searchrl.errors import DeployError

ENDPOINT = "http://34.1.2.3:30001"
scenario = sys.argv[1]
replicas = []  # SkyServe's replica table, in order
service = {"uptime": None, "version": 1}


def launch(version=None):
    def step():
        n = len(replicas) + 1
        replicas.append(ReplicaInfo(n, f"svc-{n}", "8000", False, None, version or service["version"], None))
    return step


def set_(**fields):  # the replica manager updates the newest replica's status property
    return lambda: [setattr(replicas[-1].status_property, k, v) for k, v in fields.items()]


def ready():
    set_(service_ready_now=True, first_ready_time=100.0)()
    service["uptime"] = service["uptime"] or 100


def old(final):  # a replica from the service's past: launched, READY once, then failed and torn down
    def step():
        launch()()
        set_(**{"sky_launch_status": P.SUCCEEDED, "first_ready_time": 100.0, "sky_down_status": P.SUCCEEDED,
                **final})()
    return step


def nothing():
    pass


CONTROLLER_INIT = object()


def controller_init():  # this read finds the controller VM still coming up: no replica table yet
    return CONTROLLER_INIT


start = [launch(), set_(sky_launch_status=P.RUNNING), set_(sky_launch_status=P.SUCCEEDED), nothing]
# _terminate_replica(sync_down_logs=True): logs first (FAILED_CLEANUP), then sky.down SCHEDULED/RUNNING/finished
teardown = [nothing, set_(sky_down_status=P.SCHEDULED), set_(sky_down_status=P.RUNNING)]
provision_fails = [launch(), set_(sky_launch_status=P.RUNNING), set_(sky_launch_status=P.FAILED)] + teardown + [
    set_(sky_down_status=P.SUCCEEDED)]
app_fails = start + [set_(user_app_failed=True)] + teardown


def upgrade():
    service["version"] = 2


prior = {  # the replica table before the wait's first look
    # a long-lived service: three replicas failed after being READY, so SkyServe replaced each
    "history": [old({"user_app_failed": True}), old({}), old({"user_app_failed": True}),
                lambda: service.update(uptime=50)],
    "history-then-three-more": [old({"user_app_failed": True}), lambda: service.update(uptime=50)],
    # `sky serve update` after three version-1 replicas failed before any was READY
    "outdated": [old({"user_app_failed": True, "first_ready_time": None}), old({"first_ready_time": None}),
                 old({"user_app_failed": True, "first_ready_time": None}), upgrade],
}.get(scenario, [])
for step in prior:
    step()
steps = {
    # a fresh service: the controller VM comes up first, then one replica starts and its probe passes
    "ready": [controller_init, nothing] + start + [ready],
    # replica_managers: past initial_delay_seconds -> first_ready_time = -1 and sky.down
    "initial-delay": start + [set_(first_ready_time=-1.0, sky_down_status=P.SCHEDULED),
                              set_(sky_down_status=P.SUCCEEDED)],
    "app-failed": app_fails + [set_(sky_down_status=P.SUCCEEDED)],
    "provision-then-ready": provision_fails + start + [ready],  # no capacity once; the autoscaler launches another
    "provision-thrice": provision_fails * 3,
    "cleanup-failed": app_fails + [set_(sky_down_status=P.FAILED)],
    "history": start + [ready],
    "history-then-three-more": provision_fails * 3,
    "outdated": start + [ready],
}[scenario]
seen = []


def status(name):
    i = len(seen)
    if i < len(steps) and steps[i]() is CONTROLLER_INIT:  # the controller VM is still coming up
        record = {"name": name, "status": serve_state.ServiceStatus.CONTROLLER_INIT, "endpoint": None,
                  "replica_info": []}
    else:
        ready_statuses = [r.status for r in replicas if r.is_ready]  # serve_utils passes the READY ones only
        record = {"name": name, "status": serve_state.ServiceStatus.from_replica_statuses(ready_statuses),
                  "endpoint": ENDPOINT, "uptime": service["uptime"], "version": service["version"],
                  "replica_info": [r.to_info_dict(with_handle=False, with_url=False, cluster_record=None)
                                   for r in replicas]}
    seen.append([record["status"].value, [r["status"].value for r in record["replica_info"]]])
    return [record]


now = [0.0]
lines = []
handler = logging.Handler()
handler.emit = lambda rec: lines.append(rec.getMessage())
logging.getLogger("searchrl.deploy").addHandler(handler)
logging.getLogger("searchrl.deploy").setLevel(logging.INFO)
try:
    result = {"endpoint": endpoint.wait_for_endpoint(
        "svc", interval_s=10, status_fn=status, sleep=lambda s: now.__setitem__(0, now[0] + s),
        clock=lambda: now[0])}
except DeployError as exc:
    result = {"error": str(exc)}
print(json.dumps({**result, "seen": seen, "log": lines, "waited": now[0]}))
"""


@functools.cache
def replay(scenario: str) -> dict[str, Any]:
    """What the wait saw, logged and ended with over one scenario (run once: several tests read it)."""
    return sky_json(REPLAY, scenario)


def test_wait_follows_skyserves_own_sequence_to_the_endpoint() -> None:
    result = replay("ready")
    assert result.get("endpoint") == "http://34.1.2.3:30001", result
    assert result["seen"] == [
        ["CONTROLLER_INIT", []],
        ["NO_REPLICA", []],
        ["NO_REPLICA", ["PENDING"]],
        ["NO_REPLICA", ["PROVISIONING"]],
        ["NO_REPLICA", ["STARTING"]],
        ["NO_REPLICA", ["STARTING"]],
        ["READY", ["READY"]],
    ]  # SkyServe never says REPLICA_INIT: NO_REPLICA until a replica is READY (the old wait stopped there)
    assert len(result["log"]) == 6
    assert "NO_REPLICA; replicas: 1 STARTING; waited" in result["log"][-1]


@pytest.mark.parametrize(
    ("scenario", "state", "why"),
    [
        ("initial-delay", "FAILED_INITIAL_DELAY", "within initial_delay_seconds"),
        ("app-failed", "FAILED", "setup or run exited non-zero"),
    ],
)
def test_a_failed_replica_ends_the_wait_with_one_line(scenario: str, state: str, why: str) -> None:
    result = replay(scenario)
    assert "endpoint" not in result, result
    error = result["error"]
    assert "\n" not in error
    assert error.startswith(f"service 'svc': replica 1 is {state}: "), error
    assert why in error and "`sky serve logs svc 1`" in error
    assert result["seen"][-2][1] == ["SHUTTING_DOWN"]  # tearing down is not a failure yet: still waiting
    assert result["seen"][-1] == ["NO_REPLICA", [state]]  # the service itself never reads FAILED


def test_failed_cleanup_while_skyserve_syncs_logs_is_waited_through_to_the_final_state() -> None:
    result = replay("app-failed")
    states = [replicas[0] for _, replicas in result["seen"] if replicas]
    assert states == ["PENDING", "PROVISIONING", "STARTING", "STARTING", "FAILED_CLEANUP", "FAILED_CLEANUP",
                      "SHUTTING_DOWN", "SHUTTING_DOWN", "FAILED"], states  # fmt: skip
    error = result["error"]
    assert error.startswith("service 'svc': replica 1 is FAILED: its setup or run exited non-zero"), error
    assert any("FAILED_CLEANUP: SkyServe syncs its logs" in line for line in result["log"]), result["log"]


def test_a_failed_launch_reads_failed_cleanup_then_is_replaced() -> None:
    result = replay("provision-then-ready")
    assert result.get("endpoint") == "http://34.1.2.3:30001", result
    assert ["NO_REPLICA", ["FAILED_CLEANUP"]] in result["seen"]  # the old wait stopped here
    assert ["NO_REPLICA", ["FAILED_PROVISION", "STARTING"]] in result["seen"]  # the replacement starts
    assert result["seen"][-1] == ["READY", ["FAILED_PROVISION", "READY"]]
    replaced = [line for line in result["log"] if "launches a replacement" in line]
    assert len(replaced) == 1 and "replica 1 is FAILED_PROVISION" in replaced[0]


def test_a_replica_that_stays_failed_cleanup_ends_the_wait_after_the_grace() -> None:
    result = replay("cleanup-failed")
    error = result["error"]
    assert error.startswith("service 'svc': replica 1 is FAILED_CLEANUP: SkyServe could not tear it down"), (
        error
    )
    assert "leaked cluster" in error and "\n" not in error
    states = [reps for _, reps in result["seen"]]
    # FAILED_CLEANUP (log sync), SHUTTING_DOWN (sky.down), then FAILED_CLEANUP for good once sky.down failed
    since = max(i for i, reps in enumerate(states) if reps != ["FAILED_CLEANUP"]) + 1
    assert states[since - 3 : since + 1] == [
        ["FAILED_CLEANUP"],
        ["SHUTTING_DOWN"],
        ["SHUTTING_DOWN"],
        ["FAILED_CLEANUP"],
    ]
    waited_in_cleanup = result["waited"] - 10 * since
    assert endpoint.CLEANUP_GRACE_S <= waited_in_cleanup <= endpoint.CLEANUP_GRACE_S + 30, result["waited"]


def test_replicas_that_keep_failing_to_provision_end_the_wait() -> None:
    error = replay("provision-thrice")["error"]
    assert "\n" not in error
    assert error.startswith(
        f"service 'svc': {endpoint.MAX_REPLACED_REPLICAS} replicas failed, the last: replica 3 is "
        "FAILED_PROVISION: no cloud could provision it"
    ), error
    assert "`sky serve logs svc 3`" in error


@pytest.mark.parametrize("scenario", ["history", "outdated"])
def test_failures_from_before_a_ready_replica_or_an_update_do_not_count(scenario: str) -> None:
    result = replay(scenario)
    assert result.get("endpoint") == "http://34.1.2.3:30001", result
    assert result["seen"][0][0] == "NO_REPLICA" and len(result["seen"][0][1]) == 4, result["seen"]
    assert not [line for line in result["log"] if "launches a replacement" in line]


def test_new_failures_after_a_ready_past_still_end_the_wait() -> None:
    result = replay("history-then-three-more")
    error = result["error"]
    assert error.startswith(
        f"service 'svc': {endpoint.MAX_REPLACED_REPLICAS} replicas failed, the last: replica 4 is FAILED_PROVISION"
    ), error
    assert result["seen"][0][1] == [
        "FAILED",
        "PENDING",
    ]  # replica 1 (READY once, then its app failed): not fatal


def _flaky(failures: int) -> tuple[list[int], Any]:
    calls = [0]

    def status(name: str) -> list[dict[str, Any]]:
        calls[0] += 1
        if calls[0] <= failures:
            raise DeployError(f"cannot read the status of service {name!r}: connection refused")
        return [{"status": "READY", "endpoint": "10.0.0.1:30001", "replica_info": []}]

    return calls, status


def test_one_failed_status_read_does_not_end_the_wait() -> None:
    calls, status = _flaky(endpoint.MAX_STATUS_ERRORS - 1)
    slept: list[float] = []
    assert endpoint.wait_for_endpoint("s", status_fn=status, sleep=slept.append) == "http://10.0.0.1:30001"
    assert calls[0] == endpoint.MAX_STATUS_ERRORS and slept == [10.0] * (endpoint.MAX_STATUS_ERRORS - 1)


def test_status_reads_that_keep_failing_end_the_wait_with_the_error() -> None:
    calls, status = _flaky(100)
    with pytest.raises(DeployError, match=r"cannot read the status of service 's': connection refused"):
        endpoint.wait_for_endpoint("s", status_fn=status, sleep=lambda s: None)
    assert calls[0] == endpoint.MAX_STATUS_ERRORS
