"""`dverl operator`: run the RLHFJob operator (what the Helm chart's Deployment starts).

The process serves /healthz and /metrics at once, waits to become leader on a coordination.k8s.io
Lease, then runs kopf with the handlers. If leadership is lost it stops acting and exits non-zero,
so Kubernetes restarts it as a follower: two replicas never reconcile at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import kopf

from decentralized_verl.spec import API_GROUP, API_VERSION, PLURAL
from dverl_operator import coordinator, gang, handlers, metrics, reconcile
from dverl_operator import guard_children as guard
from dverl_operator.cluster import Cluster, load_connection
from dverl_operator.health import Health
from dverl_operator.identity import load_or_create
from dverl_operator.leader import LeaderElector, identity_from_env

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("dverl_operator")
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "settings", "k8s_skip"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, plus any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool | type(None)) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if root.level > logging.DEBUG:
        logging.getLogger("kopf").setLevel(logging.WARNING)  # kopf logs every handled event at info


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
    p.add_argument(
        "--worker-image", default=os.environ.get("DVERL_WORKER_IMAGE", reconcile.Settings.default_image)
    )
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
        choices=reconcile.GATEWAY_TYPES,
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


def gang_schedulers(text: str) -> frozenset[str]:
    """`coscheduling,volcano` -> the set; an unknown name stops the operator with the names it knows."""
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(gang.KIND_KEYS))
    if unknown:
        raise SystemExit(f"--gang-schedulers: unknown {', '.join(unknown)}; expected coscheduling or volcano")
    return names


async def served_api(cluster: Cluster) -> None:
    """Raises unless the API server answers discovery for the RLHFJob API and lists rlhfjobs in it
    (discovery is readable by every authenticated client, so this needs no RBAC of its own)."""
    found = await cluster.request("GET", f"apis/{API_GROUP}/{API_VERSION}")
    served = {r.get("name") for r in found.get("resources", [])}
    if PLURAL not in served:
        raise RuntimeError(f"{API_GROUP}/{API_VERSION} does not serve {PLURAL}")


def reconcile_settings(args: argparse.Namespace, own_namespace: str) -> reconcile.Settings:
    """The reconcile policy from the command line, read once here and passed down: nothing below the
    entry reads flags or the environment."""
    policy = (
        guard.PolicyScope(own_namespace, pod_labels(args.operator_pod_labels))
        if args.network_policy == "true"
        else None
    )
    return reconcile.Settings(
        default_image=args.worker_image,
        backoff_base_seconds=args.backoff_base_seconds,
        backoff_max_seconds=args.backoff_max_seconds,
        resync_seconds=args.resync_seconds,
        volunteer_gateway=args.volunteer_gateway == "true",
        volunteer_service_type=args.volunteer_service_type,
        network_policy=policy,
        gang_schedulers=gang_schedulers(args.gang_schedulers),
    )


def kopf_settings() -> kopf.OperatorSettings:
    """kopf as this operator uses it: the Lease, not kopf's peering, decides who acts; deletion waits on
    the operator's finalizer; only warnings become Kubernetes Events."""
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.persistence.finalizer = "dverl.io/operator"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    return settings


async def serve_probes(
    args: argparse.Namespace, runtime: handlers.Runtime, health_cluster: Cluster
) -> list[web.AppRunner]:
    """/metrics and /healthz, served before leadership so that a follower is live and scrapeable too;
    returns the servers to clean up. /healthz asks the API on a connection of its own, so a busy
    reconcile pool never fails the probe."""
    servers: list[web.AppRunner] = []
    if args.metrics_port:
        servers.append(
            await metrics.serve(args.metrics_port, {"/metrics": metrics.metrics_route(runtime.metrics)})
        )
    if args.liveness_port:
        health = Health(
            api_probe=lambda: served_api(health_cluster),
            jobs=runtime.metrics.jobs_known,
            last_pass=lambda: runtime.metrics.last_pass,
            stall_after=args.stall_seconds or max(120.0, 10 * args.resync_seconds),
        )
        servers.append(await metrics.serve(args.liveness_port, {"/healthz": health.route}))
    return servers


async def lead_and_operate(
    args: argparse.Namespace, runtime: handlers.Runtime, elector: LeaderElector | None, stop: asyncio.Event
) -> int:
    """Wait to lead (or for a stop), then run kopf until a stop, kopf's own end, or lost leadership;
    returns the exit code: 1 when leadership was lost, so Kubernetes restarts the replica as a follower
    and two replicas never reconcile at once."""
    if elector is not None:
        acquiring = asyncio.ensure_future(elector.acquire())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
        acquiring.cancel()
        stopping.cancel()
        if stop.is_set():
            return 0
        runtime.metrics.leader.set(1)
    code = 0
    stop_flag = asyncio.Event()
    operator = asyncio.ensure_future(
        kopf.operator(
            registry=handlers.build_registry(),
            settings=kopf_settings(),
            standalone=True,
            clusterwide=args.all_namespaces or not args.namespace,
            namespaces=args.namespace if not args.all_namespaces else (),
            memo=kopf.Memo(runtime=runtime),
            stop_flag=stop_flag,
        )
    )
    watchers = {operator, asyncio.ensure_future(stop.wait())}
    holder = asyncio.ensure_future(elector.hold()) if elector is not None else None
    if holder is not None:
        watchers.add(holder)
    done, _ = await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
    if holder is not None and holder in done:
        code = 1  # leadership lost: stop acting at once
        log.error("leadership lost; exiting so that the replica restarts as a follower")
    stop_flag.set()
    try:
        await asyncio.wait_for(operator, timeout=10)
    except (TimeoutError, asyncio.CancelledError):
        operator.cancel()
    except Exception:
        log.exception("operator stopped with an error")
        code = code or 1
    for task in watchers:
        task.cancel()
    return code


async def run(args: argparse.Namespace) -> int:
    identity = args.identity or identity_from_env()
    own_namespace = args.lease_namespace or os.environ.get("POD_NAMESPACE") or "default"
    connection = load_connection(args.kubeconfig)
    cluster = Cluster(connection, user_agent=f"dverl-operator/{identity}")
    credentials_from = await load_or_create(cluster, own_namespace, args.identity_secret)
    settings = reconcile_settings(args, own_namespace)
    # The Lease gets its own connections, so renewals never queue behind reconcile traffic.
    lease_cluster = Cluster(connection, user_agent=f"dverl-operator/{identity}/leader-election")
    runtime = handlers.Runtime(
        cluster=cluster,
        settings=settings,
        coordinator=coordinator.CoordinatorClient(args.coordinator_address_template),
        identity=credentials_from,
        metrics=metrics.Metrics(),
        status_interval=args.status_interval,
        max_concurrent=args.max_concurrent_reconciles,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    health_cluster = Cluster(connection, user_agent=f"dverl-operator/{identity}/health")
    servers = await serve_probes(args, runtime, health_cluster)
    elector = None
    if not args.no_leader_election:
        elector = LeaderElector(
            lease_cluster,
            own_namespace,
            identity,
            lease_seconds=args.lease_seconds,
            renew_seconds=args.renew_seconds,
        )
    log.info(
        "starting",
        extra={
            "identity": identity,
            "server": cluster.server,
            "namespaces": ",".join(args.namespace) or "*",
            "leaderElection": elector is not None,
        },
    )
    try:
        return await lead_and_operate(args, runtime, elector, stop)
    finally:
        if elector is not None:
            await elector.release()
        for server in servers:
            await server.cleanup()
        await runtime.coordinator.close()
        await cluster.close()
        await lease_cluster.close()
        await health_cluster.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for `dverl operator ...`; returns the process exit code."""
    args = parser().parse_args(list(argv) if argv is not None else None)
    configure_logging(args.log_level)
    try:
        return asyncio.run(run(args))
    except kopf.LoginError as exc:
        log.error("cannot reach Kubernetes: %s", exc)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
