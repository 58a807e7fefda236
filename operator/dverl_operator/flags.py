"""`dverl operator`'s command line, and the settings read from it once here and passed down: nothing below
the entry reads flags or the environment."""

from __future__ import annotations

import argparse
import os

from dverl_operator.children import gang, guard
from dverl_operator.jobs import coordinator
from dverl_operator.reconcile.settings import GATEWAY_TYPES, Settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dverl operator", description="Run the RLHFJob operator.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch RLHFJobs in every namespace"
    )
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable)",
    )
    p.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG/~/.kube/config)"
    )
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port; 0 turns it off")
    p.add_argument("--liveness-port", type=int, default=8081, help="/healthz port; 0 turns it off")
    p.add_argument(
        "--stall-seconds",
        type=float,
        default=None,
        help="/healthz fails when jobs are known but no reconcile pass finished for this long "
        "(default: 10 resync intervals, at least 120)",
    )
    p.add_argument("--worker-image", default=os.environ.get("DVERL_WORKER_IMAGE", Settings.default_image))
    p.add_argument(
        "--resync-seconds", type=float, default=10.0, help="reconcile every job at least this often"
    )
    p.add_argument("--max-concurrent-reconciles", type=int, default=16, help="passes running at once")
    p.add_argument("--status-interval", type=float, default=5.0, help="poll each coordinator this often")
    p.add_argument("--backoff-base-seconds", type=float, default=10.0)
    p.add_argument("--backoff-max-seconds", type=float, default=300.0)
    p.add_argument(
        "--coordinator-address-template",
        default=os.environ.get(coordinator.ENV_TEMPLATE, coordinator.DEFAULT_TEMPLATE),
        help="where a job's coordinator listens; {job} and {namespace} are filled in",
    )
    p.add_argument(
        "--volunteer-gateway",
        choices=("true", "false"),
        default=os.environ.get("DVERL_VOLUNTEER_GATEWAY", "false").lower(),
        help="give each job with volunteers enabled a Service for its DHT bootstrap peer",
    )
    p.add_argument(
        "--volunteer-service-type",
        choices=GATEWAY_TYPES,
        default=os.environ.get("DVERL_VOLUNTEER_SERVICE_TYPE", "LoadBalancer"),
        help="Service type of that gateway (the chart's volunteers.gateway.serviceType)",
    )
    p.add_argument(
        "--network-policy",
        choices=("true", "false"),
        default=os.environ.get("DVERL_NETWORK_POLICY", "true").lower(),
        help="give each job a NetworkPolicy: ingress from its own pods and the operator only",
    )
    p.add_argument(
        "--operator-pod-labels",
        default=os.environ.get("DVERL_OPERATOR_POD_LABELS", "app.kubernetes.io/name=dverl"),
        help="k=v,... labels of the operator's pods, which the NetworkPolicy lets call Status",
    )
    p.add_argument(
        "--metrics-scraper-namespace-labels",
        default=os.environ.get("DVERL_METRICS_SCRAPER_NAMESPACE_LABELS"),
        help="k=v,... labels of the namespaces Prometheus runs in, let in to the learner's metrics port "
        "by each job's NetworkPolicy ('' any namespace; unset with no pod labels: no scraper)",
    )
    p.add_argument(
        "--metrics-scraper-pod-labels",
        default=os.environ.get("DVERL_METRICS_SCRAPER_POD_LABELS"),
        help="k=v,... labels of the Prometheus pods let in ('' any pod of those namespaces)",
    )
    p.add_argument(
        "--pod-service-accounts",
        default=os.environ.get("DVERL_POD_SERVICE_ACCOUNTS", ""),
        help="a,b,...: the ServiceAccounts a job's podTemplate may name (none by default)",
    )
    p.add_argument(
        "--identity-secret",
        default=os.environ.get("DVERL_IDENTITY_SECRET", "dverl-operator-identity"),
        help="Secret (in the operator's namespace) holding the CA and key that job credentials come from",
    )
    p.add_argument(
        "--gang-schedulers",
        default=os.environ.get("DVERL_GANG_SCHEDULERS", ""),
        help="comma-separated gang schedulers whose PodGroups to manage: coscheduling, volcano",
    )
    p.add_argument("--identity", default=None, help="Lease holder identity (default: $POD_NAME)")
    p.add_argument(
        "--lease-namespace",
        default=None,
        help="namespace of the leader Lease (default: $POD_NAMESPACE or default)",
    )
    p.add_argument("--lease-seconds", type=float, default=15.0)
    p.add_argument("--renew-seconds", type=float, default=5.0)
    p.add_argument("--no-leader-election", action="store_true", help="act without a Lease (one replica only)")
    p.add_argument("--log-level", default=os.environ.get("DVERL_LOG_LEVEL", "info"))
    return p


def pod_labels(text: str) -> dict[str, str]:
    labels = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    if not labels:
        raise SystemExit(f"--operator-pod-labels: expected k=v[,k=v...] (got {text!r})")
    return labels


def selector(text: str | None) -> dict[str, str] | None:
    """`k=v,k2=v2` -> labels; '' -> {} (match all); None (unset) -> None."""
    if text is None:
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    bad = [part for part in parts if "=" not in part]
    if bad:
        raise SystemExit(f"metrics scraper labels: expected k=v[,k=v...] (got {text!r})")
    return dict(part.split("=", 1) for part in parts)


def gang_schedulers(text: str) -> frozenset[str]:
    """`coscheduling,volcano` -> the set; an unknown name stops the operator with the names it knows."""
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(gang.KIND_KEYS))
    if unknown:
        raise SystemExit(f"--gang-schedulers: unknown {', '.join(unknown)}; expected coscheduling or volcano")
    return names


def reconcile_settings(args: argparse.Namespace, own_namespace: str) -> Settings:
    """The reconcile policy from the command line, read once here and passed down: nothing below the
    entry reads flags or the environment."""
    policy = (
        guard.PolicyScope(
            own_namespace,
            pod_labels(args.operator_pod_labels),
            scraper_namespace_labels=selector(args.metrics_scraper_namespace_labels),
            scraper_pod_labels=selector(args.metrics_scraper_pod_labels),
        )
        if args.network_policy == "true"
        else None
    )
    return Settings(
        default_image=args.worker_image,
        backoff_base_seconds=args.backoff_base_seconds,
        backoff_max_seconds=args.backoff_max_seconds,
        resync_seconds=args.resync_seconds,
        volunteer_gateway=args.volunteer_gateway == "true",
        volunteer_service_type=args.volunteer_service_type,
        network_policy=policy,
        gang_schedulers=gang_schedulers(args.gang_schedulers),
        service_accounts=frozenset(n.strip() for n in args.pod_service_accounts.split(",") if n.strip()),
    )
