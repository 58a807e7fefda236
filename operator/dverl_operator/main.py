"""`dverl operator`: run the RLHFJob operator (what the Helm chart's Deployment starts).

The process serves /healthz and /metrics at once, waits to become leader on a coordination.k8s.io
Lease, then runs kopf with the handlers. If leadership is lost it stops acting and exits non-zero,
so Kubernetes restarts it as a follower: two replicas never reconcile at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import kopf

from decentralized_verl.spec import API_GROUP, API_VERSION, PLURAL
from dverl_operator import handlers
from dverl_operator.flags import parser, reconcile_settings
from dverl_operator.jobs.coordinator import CoordinatorClient
from dverl_operator.jobs.identity import load_or_create
from dverl_operator.jobs.runtime import Runtime
from dverl_operator.kube.client import Cluster
from dverl_operator.kube.connection import client_config, kopf_login
from dverl_operator.kube.discovery import Discovery
from dverl_operator.logs import configure_logging
from dverl_operator.process import metrics
from dverl_operator.process.health import Health
from dverl_operator.process.leader import LeaderElector, identity_from_env

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("dverl_operator")


async def served_api(discovery: Discovery, namespaces: Sequence[str] = ()) -> None:
    """Raises unless the API server answers discovery for the RLHFJob API, lists rlhfjobs in it, and
    opens a watch of them where the operator watches (each namespace, or the cluster) with its
    credentials, as kopf's watch does."""
    if PLURAL not in await discovery.resources(API_GROUP, API_VERSION):
        raise RuntimeError(f"{API_GROUP}/{API_VERSION} does not serve {PLURAL}")
    for namespace in namespaces or (None,):
        await discovery.watch_opens(API_GROUP, API_VERSION, PLURAL, namespace)


def kopf_settings() -> kopf.OperatorSettings:
    """kopf as this operator uses it: the Lease, not kopf's peering, decides who acts (docs/operator.md
    says why); deletion waits on the operator's finalizer; only warnings become Kubernetes Events."""
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.persistence.finalizer = "dverl.io/operator"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    return settings


async def serve_probes(
    args: argparse.Namespace, runtime: Runtime, discovery: Discovery
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
        namespaces = () if args.all_namespaces else tuple(args.namespace or ())
        health = Health(
            api_probe=lambda: served_api(discovery, namespaces),
            jobs=lambda: max(runtime.metrics.jobs_known(), len(runtime.wakeups.events)),
            last_pass=lambda: runtime.metrics.last_pass,
            failing_since=lambda: runtime.metrics.failing_since,
            stall_after=args.stall_seconds or max(120.0, 10 * args.resync_seconds),
        )
        routes = {"/healthz": health.route, "/readyz": health.ready_route}
        servers.append(await metrics.serve(args.liveness_port, routes))
    return servers


async def lead_and_operate(
    args: argparse.Namespace,
    runtime: Runtime,
    login: kopf.ConnectionInfo,
    elector: LeaderElector | None,
    stop: asyncio.Event,
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
            registry=handlers.build_registry(login),
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
    login = kopf_login(args.kubeconfig)
    config = client_config(args.kubeconfig)
    cluster = Cluster(config)
    credentials_from = await load_or_create(cluster, own_namespace, args.identity_secret)
    settings = reconcile_settings(args, own_namespace)
    # The Lease gets its own connections, so renewals never queue behind reconcile traffic.
    lease_cluster = Cluster(config)
    runtime = Runtime(
        cluster=cluster,
        settings=settings,
        coordinator=CoordinatorClient(args.coordinator_address_template),
        identity=credentials_from,
        metrics=metrics.Metrics(),
        status_interval=args.status_interval,
        max_concurrent=args.max_concurrent_reconciles,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    discovery = Discovery(config)
    servers = await serve_probes(args, runtime, discovery)
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
        return await lead_and_operate(args, runtime, login, elector, stop)
    finally:
        if elector is not None:
            await elector.release()
        for server in servers:
            await server.cleanup()
        await runtime.coordinator.close()
        await cluster.close()
        await lease_cluster.close()
        await discovery.close()


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
