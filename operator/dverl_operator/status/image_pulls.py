"""Pure: containers whose image the kubelet cannot pull, in the kubelet's own words.

A pod whose image is missing from its registry, misspelt, or behind credentials the node lacks stays
Pending with a container waiting in `ErrImagePull`, then `ImagePullBackOff` between retries (or
`InvalidImageName` for a name that is not a reference at all). Nothing fails, so without this the job
would sit Pending with no word of why. The job's `ImagePullFailed` condition and message name the pod,
role, container and image with the kubelet's message; the job keeps waiting, as the kubelet keeps
retrying (the image may be pushed, or a pull secret fixed, while it waits).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dverl_operator.objects import quoting
from dverl_operator.objects.pod_state import pod_deleting, role_of

PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")


def _images(pod: Mapping[str, Any]) -> dict[str, str]:
    spec = pod.get("spec") or {}
    return {
        str(c.get("name")): str(c.get("image") or "")
        for key in ("initContainers", "containers")
        for c in spec.get(key) or []
    }


def cannot_pull(pods: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(kubelet reason, `pod NAME (ROLE): container C cannot pull image "I": MESSAGE`) for each
    container of a live pod waiting on its image."""
    found = []
    for name, pod in sorted(pods.items()):
        if pod_deleting(pod):
            continue
        images = _images(pod)
        status = pod.get("status") or {}
        for key in ("initContainerStatuses", "containerStatuses"):
            for container in status.get(key) or []:
                waiting = (container.get("state") or {}).get("waiting") or {}
                reason = str(waiting.get("reason") or "")
                if reason not in PULL_REASONS:
                    continue
                cname = str(container.get("name"))
                image = images.get(cname) or str(container.get("image") or "")
                said = quoting.head(str(waiting.get("message") or reason))
                line = f'pod {name} ({role_of(pod)}): container {cname} cannot pull image "{image}": {said}'
                found.append((reason, line))
    return found
