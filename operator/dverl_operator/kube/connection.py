"""Where the API server is and who the operator is to it, read once at start: for kopf (its watches) and
for the operator's own client, from the same source in the same order: `--kubeconfig PATH`, else the
in-cluster service account, else `$KUBECONFIG` or `~/.kube/config`."""

from __future__ import annotations

import os

import kopf
from lightkube import ConfigError, KubeConfig


def kopf_login(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    """What kopf's watches log in with (the operator's login handler hands it over)."""
    settings = kopf.OperatorSettings()
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's own login reads the same file
        info = kopf.login_with_kubeconfig(settings=settings)
    else:
        info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
            settings=settings
        )
    if info is None:
        raise kopf.LoginError("no Kubernetes credentials: not in a cluster and no kubeconfig found")
    return info


def client_config(kubeconfig: str | None = None) -> KubeConfig:
    """What the operator's own client connects with. lightkube re-reads a service-account token the
    kubelet rotated when the server refuses the old one."""
    try:
        return KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    except (ConfigError, OSError) as exc:
        raise kopf.LoginError(f"no usable Kubernetes credentials: {exc}") from exc
