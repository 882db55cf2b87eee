"""The retrieval service's TLS certificate on every training node: SEARCHRL_RETRIEVAL_CA_BUNDLE, mounted.

    export SEARCHRL_RETRIEVAL_CA_BUNDLE=~/.searchrl/tls/cert.pem     # service.tls's certfile (docs/deploy.md s. 7)
    searchrl sky train --secret RETRIEVAL_API_KEY ...                 # or make train

With `service.tls` set, SkyServe's endpoint is https://IP:PORT with a self-signed certificate that no system CA
trusts. Our clients trust the system's CAs plus the PEM file named by SEARCHRL_RETRIEVAL_CA_BUNDLE
(searchrl/http.py `tls_context`), so that file must exist on every node where verl's Ray workers build the
search tool. When the variable names a file on this machine (exported, or given with --env), the task mounts
that file on every node at REMOTE_CA_BUNDLE and the variable on the nodes names that copy. Why in Python: a mount
written in sky/train.yaml would make the certificate mandatory (SkyPilot has no optional mounts; see
index_mount.py). Without the variable the task is exactly the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from searchrl.errors import ConfigError
from searchrl.http import CA_BUNDLE_ENV, tls_context

if TYPE_CHECKING:
    import sky

REMOTE_CA_BUNDLE = (
    "~/.searchrl/retrieval-ca.pem"  # where every node finds it (file_mounts copy it to all nodes)
)


def add_ca_bundle(task: sky.Task, envs: Mapping[str, str] | None = None) -> str | None:
    """Mount the local SEARCHRL_RETRIEVAL_CA_BUNDLE (from `envs`, else the environment) on every node of
    `task` and point the variable there at it; returns the remote path, or None when the variable is unset."""
    value = ((envs or {}).get(CA_BUNDLE_ENV) or os.environ.get(CA_BUNDLE_ENV) or "").strip()
    if not value:
        return None
    local = Path(value).expanduser()
    if not local.is_file():
        raise ConfigError(
            f"{CA_BUNDLE_ENV}={value}: no such file on this machine; name the PEM certificate of the retrieval "
            "service's service.tls (docs/deploy.md section 7)"
        )
    tls_context(local)  # a readable PEM certificate, or one line now instead of a TLS error on every node
    task.update_file_mounts({REMOTE_CA_BUNDLE: str(local.resolve())})
    task.update_envs({CA_BUNDLE_ENV: REMOTE_CA_BUNDLE})
    return REMOTE_CA_BUNDLE


__all__ = ["CA_BUNDLE_ENV", "REMOTE_CA_BUNDLE", "add_ca_bundle"]
