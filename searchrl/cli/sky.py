"""`searchrl sky ...`: the SkyPilot control layer (library code in searchrl/deploy/).

    searchrl sky validate [PATH ...] [--env K=V ...] [--secret NAME ...]
    searchrl sky endpoint searchrl-retrieval [--timeout S]
    searchrl sky probe http://127.0.0.1:8000 [--env K=V ...] [--secret NAME ...]
    searchrl sky serve [--dry-run] [--name NAME] [--env K=V ...] [--secret NAME ...]  # retrieval.yaml on SkyServe
    searchrl sky start-budget --corpus wiki18 --backend dense --delay 2000 --index-bucket B   # in its setup
    searchrl sky train [--dry-run] [--num-nodes N] [--network-tier standard|best] [--infra CLOUD/REGION]
                       [--env K=V ...] [--secret NAME ...] [--service NAME]

A `--secret` flag takes a NAME; its value is read from the environment, so no secret ever reaches argv or `ps`.
When this interpreter has no SkyPilot, the command re-runs itself with `.venv-sky/bin/python` (SkyPilot's pins
clash with verl's; see searchrl/deploy/skypilot.py).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from searchrl.cli.flags import Handler, group, verb

# dest -> flag, for re-running a parsed command in the SkyPilot venv
_FLAGS = {
    "env": "--env",
    "secret": "--secret",
    "timeout": "--timeout",
    "yaml": "--yaml",
    "service": "--service",
    "name": "--name",
    "health_deadline": "--health-deadline",
    "num_nodes": "--num-nodes",
    "cpus": "--cpus",
    "memory": "--memory",
    "disk_size": "--disk-size",
    "image_id": "--image-id",
    "network_tier": "--network-tier",
    "infra": "--infra",
}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """SkyPilot tasks: validate, endpoint, probe, serve, train

    Validate the sky/ task files, find the retrieval endpoint, launch the trainer.
    """
    verbs = group(sub, "sky", register, dest="sky_verb")

    v = verb(verbs, "validate", _validate)
    v.add_argument("paths", nargs="*", help="task files (default: the five in sky/)")
    _add_overrides(v)

    e = verb(verbs, "endpoint", _endpoint)
    e.add_argument("service_name", metavar="NAME", help="service name, e.g. searchrl-retrieval")
    e.add_argument(
        "--timeout",
        type=float,
        help="seconds to wait for READY (default 2600: the probe's 2000 s initial delay + provisioning)",
    )

    r = verb(verbs, "probe", _probe)
    r.add_argument("url", help="base URL of a replica or local service, e.g. http://127.0.0.1:8000")
    r.add_argument("--yaml", help="service task file (default sky/retrieval.yaml)")
    _add_overrides(r)

    s = verb(verbs, "serve", _serve)
    s.add_argument("--dry-run", dest="dry_run", action="store_true", help="print the task; launch nothing")
    s.add_argument("--name", help="service name (default searchrl-retrieval)")
    s.add_argument("--yaml", help="service task file (default sky/retrieval.yaml)")
    s.add_argument("--cpus", help="as sky serve up --cpus, e.g. 8+ (wiki18-100k), 16+ (wiki18)")
    s.add_argument("--memory", help="as sky serve up --memory, e.g. 16+ (wiki18-100k), 96+ (wiki18 Flat)")
    s.add_argument(
        "--disk-size", dest="disk_size", type=int, help="GB, as sky serve up --disk-size (wiki18: 256)"
    )
    s.add_argument(
        "--image-id",
        dest="image_id",
        help="e.g. docker:<registry>/searchrl-retrieval:0.1.0-sky (the Dockerfile's --target sky)",
    )
    _add_overrides(s)

    b = verb(verbs, "start-budget", _start_budget, suppress=False)
    b.add_argument("--corpus", required=True, help="SEARCHRL_RETRIEVAL_CORPUS, e.g. bundled, wiki18")
    b.add_argument("--backend", required=True, help="SEARCHRL_RETRIEVAL_BACKEND, e.g. bm25, dense")
    b.add_argument("--delay", required=True, type=float, help="readiness_probe.initial_delay_seconds")
    b.add_argument(
        "--index-bucket",
        dest="index_bucket",
        default="",
        help="SEARCHRL_INDEX_BUCKET: non-empty = the index is copied from the bucket, not downloaded or built",
    )
    b.add_argument(
        "--install",
        choices=["pip", "image"],
        default="pip",
        help="pip: setup installs torch and the package (~300 s); image: the image_id already has searchrl",
    )

    from searchrl.cli.start_time import register_start_time

    register_start_time(verbs)

    t = verb(verbs, "train", _train)
    t.add_argument(
        "--dry-run",
        dest="dry_run",
        action="store_true",
        help="print the task; launch nothing (without RETRIEVAL_SERVICE_URL: waits for no service, checks none)",
    )
    t.add_argument("--service", help="retrieval service name (default searchrl-retrieval)")
    t.add_argument("--name", help="managed job name (default searchrl-train)")
    t.add_argument("--num-nodes", dest="num_nodes", type=int, help="nodes of 8 GPUs (default: the YAML's 2)")
    t.add_argument("--yaml", help="task file (default sky/train.yaml)")
    t.add_argument("--health-deadline", dest="health_deadline", type=float, help="seconds (default 120)")
    t.add_argument(
        "--network-tier",
        dest="network_tier",
        choices=["standard", "best"],
        help="standard (default): any cloud; best: EFA/GPUDirect/InfiniBand, AWS, GCP and Nebius only "
        "(docs/deploy.md)",
    )
    t.add_argument(
        "--infra",
        help="as sky jobs launch --infra, e.g. aws/us-east-1: the job and its recoveries stay by the checkpoint bucket",
    )
    _add_overrides(t)


def _add_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", action="append", metavar="K=V", help="override an envs: entry (repeatable)")
    p.add_argument(
        "--secret",
        action="append",
        metavar="NAME",
        help="pass a secret by NAME; the value is read from $NAME",
    )


def _setup_logging() -> None:
    from searchrl.logs import setup_logging

    setup_logging()
    # SkyPilot's client may start its local API server in-process; its database migrations log at INFO.
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _argv(args: argparse.Namespace, verb: str, positional: list[str]) -> list[str]:
    out = ["sky", verb, *positional]
    if getattr(args, "dry_run", False):
        out.append("--dry-run")
    for dest, flag in _FLAGS.items():
        value = getattr(args, dest, None)
        for item in value if isinstance(value, list) else ([] if value is None else [value]):
            out += [flag, str(item)]
    return out


def _check_env_keys(args: argparse.Namespace) -> None:
    """A misspelt SEARCHRL_* name in --env would reach the task and be ignored there: refuse it here, before
    SkyPilot is even imported."""
    from searchrl import config
    from searchrl.deploy import tasks
    from searchrl.infer.settings import InferSettings
    from searchrl.retrieval.settings import RetrievalSettings
    from searchrl.trainer.settings import TrainSettings

    classes = (RetrievalSettings, InferSettings, TrainSettings)
    unknown = config.unknown_env_keys(tasks.parse_env_flags(getattr(args, "env", [])), classes)
    if unknown:
        valid = set(config.OTHER_ENV_NAMES).union(*(config.env_names(cls) for cls in classes))
        raise config.unknown_name_error(unknown, valid, "passed with --env")


def _needs_sky(*positional: str) -> Callable[[Handler], Handler]:
    """A verb that runs SkyPilot: refuse a misspelt --env name, then, when this interpreter has no SkyPilot,
    re-run the command in the SkyPilot venv (its exit code is the verb's) instead of the handler.

    `positional`: the dests of the verb's positional arguments, in order, for the re-run's argv.
    """

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        def run(args: argparse.Namespace) -> int:
            from searchrl.deploy import skypilot

            _check_env_keys(args)
            if skypilot.sky_importable():
                return handler(args)
            values = [getattr(args, dest, []) for dest in positional]
            words = [str(w) for v in values for w in (v if isinstance(v, list) else [v])]
            return skypilot.run_in_sky_venv(_argv(args, args.sky_verb, words))

        return run

    return wrap


def _task_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """What `serve` and `train` plan their task from: the --env overrides, the --secret names, the --yaml file."""
    from searchrl.deploy import tasks

    return {
        "envs": tasks.parse_env_flags(getattr(args, "env", [])),
        "secret_names": getattr(args, "secret", []),
        "yaml_path": Path(args.yaml) if hasattr(args, "yaml") else None,
    }


@_needs_sky("paths")
def _validate(args: argparse.Namespace) -> int:
    """check every sky/*.yaml with SkyPilot's own parser and our rules

    Parse each task with SkyPilot (env/secret overrides applied), check service rules, leftover $VARs and
    accelerators. Required envs/secrets not given get placeholders.
    """
    from searchrl.deploy import tasks
    from searchrl.errors import DeployError

    envs = tasks.parse_env_flags(getattr(args, "env", []))
    secrets = tasks.secrets_from_env(getattr(args, "secret", []), required=False)
    files = [Path(p) for p in getattr(args, "paths", [])] or tasks.task_files()
    reports = tasks.validate_files(files, envs, secrets)
    for rep in reports:
        if rep.ok:
            needs = f"  (launch needs {' '.join(rep.needs)})" if rep.needs else ""
            print(f"ok    {rep.path}{needs}")  # noqa: T201
        else:
            for problem in rep.problems:
                print(f"FAIL  {rep.path}: {problem}")  # noqa: T201
    bad = [r for r in reports if not r.ok]
    if bad:
        raise DeployError(
            f"{len(bad)} of {len(reports)} task files invalid: {bad[0].path}: {bad[0].problems[0]}"
        )
    return 0


@_needs_sky("service_name")
def _endpoint(args: argparse.Namespace) -> int:
    """wait until a SkyServe service is READY and print its URL"""
    from searchrl.deploy import endpoint

    _setup_logging()
    timeout = getattr(args, "timeout", endpoint.ENDPOINT_TIMEOUT_S)
    print(endpoint.wait_for_endpoint(args.service_name, timeout_s=timeout))  # noqa: T201
    return 0


def _start_budget(args: argparse.Namespace) -> int:
    """say whether a retrieval replica starts within the probe's initial delay (run in setup)

    Estimated seconds from replica setup to the first 200 on /retrieve for a corpus and backend
    (docs/deploy.md); exit 2 with one line when they exceed --delay. Needs no SkyPilot.
    """
    from searchrl.deploy.replica_budget import start_budget

    # Runs on a replica, whose venv has no SkyPilot: never re-executes itself in .venv-sky.
    line = start_budget(
        args.corpus,
        args.backend,
        args.delay,
        prebuilt=bool(args.index_bucket.strip()),
        install=args.install,
    )
    print(line, file=sys.stderr)  # noqa: T201
    return 0


@_needs_sky()
def _serve(args: argparse.Namespace) -> int:
    """launch sky/retrieval.yaml on SkyServe, with the index bucket mounted when SEARCHRL_INDEX_BUCKET is set

    Parse sky/retrieval.yaml with SkyPilot (env/secret overrides applied), add the read-only index bucket
    mount when --env SEARCHRL_INDEX_BUCKET=... is given (SkyPilot cannot make a mount optional in the file),
    check it as `searchrl sky validate` does, then `sky serve up`.
    """
    from searchrl.deploy import endpoint, launch

    _setup_logging()
    plan = launch.plan_serve(
        **_task_inputs(args),
        resources={k: getattr(args, k, None) for k in ("cpus", "memory", "disk_size", "image_id")},
    )
    if plan.index_mount:
        logging.getLogger(__name__).info("index bucket mounted read-only at %s", plan.index_mount)
    if getattr(args, "dry_run", False):
        print(plan.text, end="")  # noqa: T201
        return 0
    name = launch.launch_serve(plan, service_name=getattr(args, "name", endpoint.DEFAULT_SERVICE))
    print(f"service {name} is starting (searchrl sky endpoint {name})")  # noqa: T201
    return 0


@_needs_sky("url")
def _probe(args: argparse.Namespace) -> int:
    """send sky/retrieval.yaml's readiness probe to a URL, exactly as SkyServe would"""
    from searchrl.deploy import endpoint, skypilot, tasks
    from searchrl.errors import DeployError

    envs = tasks.parse_env_flags(getattr(args, "env", []))
    secrets = tasks.secrets_from_env(getattr(args, "secret", []))
    path = Path(getattr(args, "yaml", skypilot.SKY_DIR / "retrieval.yaml"))
    task = tasks.load_task(path, envs, secrets)
    left = tasks.leftover_vars(task)
    if left:
        name = left[0].rsplit("$", 1)[1]
        raise DeployError(
            f"{path}: the probe would send a literal {left[0]}: pass --secret {name} (or --env)"
        )
    probe = endpoint.readiness_probe(task)
    status, body = endpoint.send_probe(args.url, probe)
    line = f"{probe.method} {probe.path} -> {status}"
    if status != 200:
        raise DeployError(f"readiness probe failed: {line}: {' '.join(body.split())[:200]}")
    print(line)  # noqa: T201
    return 0


@_needs_sky()
def _train(args: argparse.Namespace) -> int:
    """resolve the endpoint, health-check it, launch sky/train.yaml as a managed job"""
    from searchrl.deploy import endpoint, launch

    _setup_logging()
    plan_service = getattr(args, "service", endpoint.DEFAULT_SERVICE)
    plan = launch.plan_train(
        **_task_inputs(args),
        service=plan_service,
        health_deadline_s=getattr(args, "health_deadline", 120.0),
        num_nodes=getattr(args, "num_nodes", None),
        network_tier=getattr(args, "network_tier", "standard"),
        infra=getattr(args, "infra", None),
        dry_run=getattr(args, "dry_run", False),
    )
    # the step's cost as YAML comments after the task: the printed plan stays one loadable task file
    cost = "".join(
        f"# {line}\n" for line in [*plan.placement, "step cost (trainer/step_cost.py):", *plan.cost]
    )
    if getattr(args, "dry_run", False):
        print(plan.text + cost, end="")  # noqa: T201
        if not plan.resolved:
            print(  # noqa: T201
                f"dry run: RETRIEVAL_SERVICE_URL above is a placeholder ({launch.UNRESOLVED_URL}); nothing waited "
                f"for or checked the service (a launch waits for {plan_service} to be READY, health-checks it and "
                "checks its corpus)",
                file=sys.stderr,
            )
        print(launch.MERGE_NOTE, file=sys.stderr)  # noqa: T201
        print(launch.billing_reminder(plan_service), file=sys.stderr)  # noqa: T201
        return 0
    print(cost, end="")  # noqa: T201
    job = launch.launch_train(plan, job_name=getattr(args, "name", launch.DEFAULT_JOB))
    print(f"launched managed job {job} (sky jobs logs {job})")  # noqa: T201
    print(launch.billing_reminder(plan_service), file=sys.stderr)  # noqa: T201
    return 0
