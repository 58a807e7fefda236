"""The operator's API layer (`dverl_operator.kube`) against kmock's Kubernetes API emulator: each verb
answers as the reconcile loop expects (a missing object is None or False, an existing one False on create),
and every failure is one of two errors: the server's answer with its status, reason and message
(`ApiError`), or no answer (`ApiUnreachable`).

Here the pure checks; the ones with real processes and servers in tests/integration/, under the same name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dverl_operator.kube.connection import client_config

pytestmark = [pytest.mark.timeout(120)]


def test_credentials_that_cannot_be_read_stop_the_operator_by_name(tmp_path: Path) -> None:
    import kopf

    with pytest.raises(kopf.LoginError, match="no usable Kubernetes credentials"):
        client_config(str(tmp_path / "missing-kubeconfig.yaml"))
