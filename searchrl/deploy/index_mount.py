"""The optional index bucket of sky/retrieval.yaml: mounted read-only on replicas when SEARCHRL_INDEX_BUCKET is set.

    searchrl sky serve --env SEARCHRL_INDEX_BUCKET=my-searchrl-index --secret RETRIEVAL_API_KEY

Why in Python and not in the YAML: SkyPilot 0.14.1 substitutes `$VAR`s in `file_mounts` (task.py
`_fill_in_env_vars`), but has no `${VAR:-default}` and no conditional mounts, and a mount whose source is empty
parses offline and then fails at launch (`Storage._validate_storage_spec`: "Storage name must be specified if the
source is local"). So a mount in the file would make the bucket mandatory for every replica, bundled corpus
included. Instead `searchrl sky ...` (serve, validate, probe) adds this mount to the SkyPilot-parsed task when the
env is non-empty and the file does not already mount that path (sky/index-build.yaml declares its own,
writable one). Without the env the task is exactly the file, as `sky serve up` would run it.

Mode MOUNT with `config.mount.read_only: true` (goofys/gcsfuse/blobfuse2 or rclone with `--read-only`): a
replica can never change the shared index, and nothing is cached on the replica's disk by the mount itself.
Setup copies the files its backend needs from the mount to local disk (`searchrl index copy`) and the service
mmaps them there; docs/deploy.md section 6 says why not MOUNT_CACHED or mmap over the mount.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sky

BUCKET_ENV = "SEARCHRL_INDEX_BUCKET"
MOUNT_ENV = "SEARCHRL_INDEX_MOUNT"
DEFAULT_MOUNT = "/searchrl-index"


def mount_config(bucket: str) -> dict[str, Any]:
    """The file_mounts entry (YAML form) for a replica's read-only view of `bucket`.

    `s3://...`, `gs://...` and other URLs are existing buckets (`source:`); a bare name is a SkyPilot-managed bucket
    (`name:`, as sky/index-build.yaml and train.yaml's CHECKPOINT_BUCKET use it).
    """
    where = {"source": bucket} if "://" in bucket else {"name": bucket}
    # persistent: `sky serve down` must never delete the bucket every replica (and the next service) reads
    return {**where, "persistent": True, "mode": "MOUNT", "config": {"mount": {"read_only": True}}}


def add_index_mount(task: sky.Task) -> str | None:
    """Mount the task's SEARCHRL_INDEX_BUCKET read-only at SEARCHRL_INDEX_MOUNT; returns the path, or None.

    Does nothing when the env is empty or absent, or when the task already mounts that path.
    """
    envs = dict(task.envs or {})
    bucket = envs.get(BUCKET_ENV, "").strip()
    if not bucket:
        return None
    path = envs.get(MOUNT_ENV) or DEFAULT_MOUNT
    if path in (task.storage_mounts or {}):
        return None
    from sky.data import storage

    task.update_storage_mounts({path: storage.Storage.from_yaml_config(mount_config(bucket))})
    return path


__all__ = ["BUCKET_ENV", "DEFAULT_MOUNT", "MOUNT_ENV", "add_index_mount", "mount_config"]
