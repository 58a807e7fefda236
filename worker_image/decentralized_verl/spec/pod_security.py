"""Pure: the Kubernetes Pod Security Standards, "baseline" and "restricted", rule by rule as
https://kubernetes.io/docs/concepts/security/pod-security-standards/ documents them, and the security
settings that keep a worker pod within "restricted".

`violations(pod, "restricted")` lists every rule the pod breaks, each with the field and the value found,
the way the Pod Security admission controller would refuse it (empty: admitted). `dverl validate` runs it
over what a role's podTemplate adds to its pods (`template_pod`), the operator over every pod it builds,
before creating any, at the level the job declares (`spec.podSecurity`, restricted unless it says
otherwise); `permits` says whether a namespace's enforce label admits that level. It knows nothing of the
operator.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Level = Literal["baseline", "restricted"]
PodSecurityLevel = Literal["privileged", "baseline", "restricted"]
"""A job's declared level: the Pod Security Admission level names, least to most restrictive."""
LEVELS: tuple[PodSecurityLevel, ...] = ("privileged", "baseline", "restricted")
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


@dataclass(frozen=True)
class Violation:
    level: Level
    rule: str
    """The control's name in the standard (Host Namespaces, Capabilities, ...)."""
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.level} {self.rule}: {self.field}: {self.message}"


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in CONTAINER_LISTS:
        for i, container in enumerate(spec.get(kind) or []):
            yield f"spec.{kind}[{i}]", container


def _security(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return node.get("securityContext") or {}


def baseline(pod: Mapping[str, Any]) -> Iterator[Violation]:
    spec = pod.get("spec") or {}
    pod_sc = _security(spec)

    def v(rule: str, field: str, message: str) -> Violation:
        return Violation("baseline", rule, field, message)

    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        yield v("HostProcess", "spec.securityContext.windowsOptions.hostProcess", "must be unset or false")
    for name in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(name):
            yield v("Host Namespaces", f"spec.{name}", "must be unset or false")
    for i, volume in enumerate(spec.get("volumes") or []):
        if "hostPath" in volume:
            yield v("HostPath Volumes", f"spec.volumes[{i}].hostPath", "must be unset")
    yield from _apparmor(pod, pod_sc, "spec.securityContext", v)
    yield from _selinux(pod_sc, "spec.securityContext", v)
    kind = (pod_sc.get("seccompProfile") or {}).get("type")
    if kind is not None and kind not in SECCOMP_TYPES:
        yield v(
            "Seccomp",
            "spec.securityContext.seccompProfile.type",
            f"{kind!r} is not RuntimeDefault or Localhost",
        )
    for i, sysctl in enumerate(pod_sc.get("sysctls") or []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield v(
                "Sysctls", f"spec.securityContext.sysctls[{i}].name", f"{sysctl.get('name')!r} is not safe"
            )
    for where, container in _containers(spec):
        sc = _security(container)
        at = f"{where}.securityContext"
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield v("HostProcess", f"{at}.windowsOptions.hostProcess", "must be unset or false")
        if sc.get("privileged"):
            yield v("Privileged Containers", f"{at}.privileged", "must be unset or false")
        added = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if added:
            yield v("Capabilities", f"{at}.capabilities.add", f"{sorted(added)} are beyond the default set")
        for j, port in enumerate(container.get("ports") or []):
            if port.get("hostPort"):
                yield v(
                    "Host Ports",
                    f"{where}.ports[{j}].hostPort",
                    f"must be unset or 0 (got {port['hostPort']})",
                )
        yield from _apparmor(None, sc, at, v)
        yield from _selinux(sc, at, v)
        if sc.get("procMount") not in (None, "Default"):
            yield v(
                "/proc Mount Type", f"{at}.procMount", f"must be unset or Default (got {sc['procMount']!r})"
            )
        kind = (sc.get("seccompProfile") or {}).get("type")
        if kind is not None and kind not in SECCOMP_TYPES:
            yield v("Seccomp", f"{at}.seccompProfile.type", f"{kind!r} is not RuntimeDefault or Localhost")


def _apparmor(pod: Mapping[str, Any] | None, sc: Mapping[str, Any], at: str, v: Any) -> Iterator[Violation]:
    kind = (sc.get("appArmorProfile") or {}).get("type")
    if kind is not None and kind not in APPARMOR_TYPES:
        yield v("AppArmor", f"{at}.appArmorProfile.type", f"{kind!r} is not RuntimeDefault or Localhost")
    if pod is None:
        return
    for key, value in ((pod.get("metadata") or {}).get("annotations") or {}).items():
        if (
            key.startswith(APPARMOR_ANNOTATION)
            and value != "runtime/default"
            and not value.startswith("localhost/")
        ):
            yield v(
                "AppArmor",
                f"metadata.annotations[{key!r}]",
                f"{value!r} is not runtime/default or localhost/*",
            )


def _selinux(sc: Mapping[str, Any], at: str, v: Any) -> Iterator[Violation]:
    options = sc.get("seLinuxOptions") or {}
    if options.get("type") not in (None, *SELINUX_TYPES):
        yield v("SELinux", f"{at}.seLinuxOptions.type", f"{options['type']!r} is not an allowed type")
    for key in ("user", "role"):
        if options.get(key) not in (None, ""):
            yield v("SELinux", f"{at}.seLinuxOptions.{key}", "must be unset or empty")


def restricted(pod: Mapping[str, Any]) -> Iterator[Violation]:
    """The rules restricted adds to baseline."""
    spec = pod.get("spec") or {}
    pod_sc = _security(spec)

    def v(rule: str, field: str, message: str) -> Violation:
        return Violation("restricted", rule, field, message)

    for i, volume in enumerate(spec.get("volumes") or []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            yield v("Volume Types", f"spec.volumes[{i}]", f"{sorted(kinds - RESTRICTED_VOLUMES)} not allowed")
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    if pod_sc.get("runAsNonRoot") is False:
        yield v("Running as Non-root", "spec.securityContext.runAsNonRoot", "must be true or unset")
    if pod_sc.get("runAsUser") == 0:
        yield v("Running as Non-root user", "spec.securityContext.runAsUser", "must not be 0")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type") in SECCOMP_TYPES
    for where, container in _containers(spec):
        sc = _security(container)
        at = f"{where}.securityContext"
        if sc.get("allowPrivilegeEscalation") is not False:
            yield v("Privilege Escalation", f"{at}.allowPrivilegeEscalation", "must be false")
        non_root = sc.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            yield v("Running as Non-root", f"{at}.runAsNonRoot", "must be true (here or on the pod)")
        if sc.get("runAsUser") == 0:
            yield v("Running as Non-root user", f"{at}.runAsUser", "must not be 0")
        kind = (sc.get("seccompProfile") or {}).get("type")
        if kind is None and not pod_seccomp:
            yield v(
                "Seccomp",
                f"{at}.seccompProfile.type",
                "must be RuntimeDefault or Localhost (here or on the pod)",
            )
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield v("Capabilities", f"{at}.capabilities.drop", "must include ALL")
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            yield v(
                "Capabilities",
                f"{at}.capabilities.add",
                f"only NET_BIND_SERVICE may be added (got {sorted(added)})",
            )


def violations(pod: Mapping[str, Any], level: PodSecurityLevel = "restricted") -> list[Violation]:
    """Every rule of `level` (restricted includes baseline) the pod breaks; empty when it is admitted
    (always at privileged, which has no rules)."""
    if level == "privileged":
        return []
    found = list(baseline(pod))
    if level == "restricted":
        found.extend(restricted(pod))
    return found


def outside(level: PodSecurityLevel, rule: str) -> str:
    """How a problem names the level (the job's spec.podSecurity) a rule of it belongs to."""
    return f"outside Pod Security {level}: {rule}"


def enforced_level(namespace_labels: Mapping[str, str]) -> PodSecurityLevel | None:
    """The level a namespace's `pod-security.kubernetes.io/enforce` label enforces: None when unlabelled
    (the cluster's admission default applies, which a label cannot show); a value that is not a level
    enforces restricted, as Pod Security Admission fails closed on a bad label."""
    value = namespace_labels.get(ENFORCE_LABEL)
    if value is None:
        return None
    return value if value in LEVELS else "restricted"  # type: ignore[return-value]


def permits(enforced: PodSecurityLevel | None, wanted: PodSecurityLevel) -> bool:
    """Whether a namespace enforcing `enforced` admits pods that need `wanted`: only a level at least as
    permissive as the one the pods need."""
    return enforced is None or LEVELS.index(enforced) <= LEVELS.index(wanted)


WORKER_UID = 10001
WORKER_GID = 10001
"""The worker image's user and group (Dockerfile USER 10001:10001)."""


def pod_security_context() -> dict[str, Any]:
    """The pod-level settings every worker pod runs with."""
    return {
        "runAsNonRoot": True,
        "runAsUser": WORKER_UID,
        "runAsGroup": WORKER_GID,
        "fsGroup": WORKER_GID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """The container-level settings every container of a worker pod runs with."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def hardened(container: Mapping[str, Any]) -> dict[str, Any]:
    """A container given by a user (a pod template's init container) with the restricted settings filled in
    where it says nothing; what it does say is kept (the admission check judges it)."""
    security = {**container_security_context(), **(container.get("securityContext") or {})}
    return {**container, "securityContext": security}


def template_pod(
    annotations: Mapping[str, str], volumes: list[dict[str, Any]], init_containers: list[dict[str, Any]]
) -> dict[str, Any]:
    """What a role's podTemplate puts into its pods that the standard judges, as the operator merges it:
    its annotations, its volumes, its init containers hardened; the rest of the pod is the operator's
    own, which keeps to "restricted" by construction."""
    return {
        "metadata": {"annotations": dict(annotations)},
        "spec": {
            "securityContext": pod_security_context(),
            "volumes": list(volumes),
            "initContainers": [hardened(c) for c in init_containers],
        },
    }
