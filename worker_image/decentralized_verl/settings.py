"""The worker environment: every `DVERL_*` and rank variable a worker process reads, declared once, typed.

The operator (pod env) and `dverl run` (local processes) set these from the plan; a person sets the few
marked "tuning" by hand. A process reads them once, through `WorkerSettings.from_env()` at its entry
(tests/unit/test_settings.py lists the entry modules), and passes the values down; nothing else in the
package reads `os.environ` for a `DVERL_*` name. The table "Worker environment" in docs/environment.md
is `settings_table()`, checked by a test. Torch-free: the operator and the plan import the names from
here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from decentralized_verl.errors import DverlError

SERVICE_ROLES: tuple[str, ...] = ("rollout", "reward", "reference", "critic")
"""Roles served over gRPC to the coordinator, which it reaches by address (DVERL_<ROLE>_ADDRS / _POOLS);
the learner itself serves Status and Weights."""

AddressList = Annotated[tuple[str, ...], Field(default=())]


class SettingsError(DverlError):
    """A DVERL_* variable holds something its declared type does not allow; the message names it."""


class WorkerSettings(BaseModel):
    """Each field's alias is the variable's name; its description is docs/environment.md's documentation."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    # -- set by the plan for every worker (pods and `dverl run`)
    job: str = Field("", alias="DVERL_JOB", description="plan: the job's name")
    role: str = Field("", alias="DVERL_ROLE", description="plan: this worker's role")
    index: int = Field(0, alias="DVERL_INDEX", description="plan: this worker's index within its role")
    worker_name: str = Field("", alias="DVERL_WORKER_NAME", description="plan: `<job>-<role>-<index>`")
    pool: str = Field("", alias="DVERL_POOL", description="plan: the node pool this worker runs in")
    learner_addr: str | None = Field(
        None,
        alias="DVERL_LEARNER_ADDR",
        description="plan: learner `host:port` rollout workers pull weights from",
    )
    dht_addr: str | None = Field(
        None,
        alias="DVERL_DHT_ADDR",
        description="plan: the job's DHT bootstrap `host:port`, or the whole `/p2p/` multiaddr it printed",
    )
    rollout_addrs: AddressList = Field(
        alias="DVERL_ROLLOUT_ADDRS",
        description="plan, learner: rollout workers' `host:port`, comma-separated",
    )
    reward_addrs: AddressList = Field(alias="DVERL_REWARD_ADDRS", description="plan, learner: reward workers")
    reference_addrs: AddressList = Field(
        alias="DVERL_REFERENCE_ADDRS", description="plan, learner: reference workers"
    )
    critic_addrs: AddressList = Field(alias="DVERL_CRITIC_ADDRS", description="plan, learner: critic workers")
    rollout_pools: AddressList = Field(
        alias="DVERL_ROLLOUT_POOLS",
        description="plan, learner: each rollout worker's GPU type or pool (dispatch priors)",
    )
    reward_pools: AddressList = Field(alias="DVERL_REWARD_POOLS", description="plan, learner: as above")
    reference_pools: AddressList = Field(alias="DVERL_REFERENCE_POOLS", description="plan, learner: as above")
    critic_pools: AddressList = Field(alias="DVERL_CRITIC_POOLS", description="plan, learner: as above")

    # -- set by the operator in pods
    config: str | None = Field(
        None,
        alias="DVERL_CONFIG",
        description="operator: the mounted job config (workers.yaml lies beside it)",
    )
    output: str | None = Field(
        None, alias="DVERL_OUTPUT", description="operator: the learner's run folder (checkpoints, metrics)"
    )
    join_secret: str | None = Field(
        None, alias="DVERL_JOIN_SECRET", description="operator: the volunteer join secret (from the Secret)"
    )
    join_secret_file: str | None = Field(
        None, alias="DVERL_JOIN_SECRET_FILE", description="the join secret in a file instead (wins when set)"
    )
    bind_host: str | None = Field(
        None,
        alias="DVERL_BIND_HOST",
        description="where servers listen (default: 0.0.0.0 in a pod, else 127.0.0.1)",
    )
    tls_dir: str | None = Field(
        None,
        alias="DVERL_TLS_DIR",
        description="operator, `dverl run`: the job's credentials (TLS, job token, weight keys); "
        "servers refuse calls without the token, receivers refuse unsigned weights",
    )

    secrets_fd: int | None = Field(
        None,
        alias="DVERL_SECRETS_FD",
        description="`dverl run`: the socket a worker reads its private keys and token from, once, at entry",
    )
    die_with_parent: int | None = Field(
        None,
        alias="DVERL_DIE_WITH_PARENT",
        description="`dverl run`: the launcher's pid; the worker ends when that process dies",
    )
    guarded_by: str | None = Field(
        None,
        alias="DVERL_GUARDED_BY",
        description="set by a process's orphan watchdog for everything it starts: `pid:start,...`",
    )

    kubernetes_host: str | None = Field(
        None,
        alias="KUBERNETES_SERVICE_HOST",
        description="Kubernetes, in every pod: servers then listen on 0.0.0.0 unless `DVERL_BIND_HOST` says",
    )

    # -- torch.distributed's rendezvous, set by the plan for each rank of a learner or critic gang
    rank: int = Field(0, ge=0, alias="RANK", description="plan: this process's rank in its gang")
    world_size: int | None = Field(
        None, ge=1, alias="WORLD_SIZE", description="plan: the gang's size (default: the role's replicas)"
    )
    local_rank: int = Field(0, ge=0, alias="LOCAL_RANK", description="plan: the GPU a rank computes on")
    visible_devices: str | None = Field(
        None,
        alias="CUDA_VISIBLE_DEVICES",
        description="the device plugin, `dverl run`'s layout: the GPUs this process may see (empty: none)",
    )
    gpu_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        alias="DVERL_GPU_MEMORY_FRACTION",
        description="`dverl run`'s layout: a vLLM rollout's share of a GPU other workers share (the "
        "planner's estimate of what it needs)",
    )
    gpu_shared_with_learner: bool = Field(
        False,
        alias="DVERL_GPU_SHARED_WITH_LEARNER",
        description="`dverl run`'s layout: `1` when this rollout's GPU is the learner's too (a vLLM engine "
        "on CUDA then sleeps while the learner updates)",
    )
    device: str | None = Field(
        None,
        alias="DVERL_DEVICE",
        description="`dverl run`'s layout, or by hand: auto, cpu or cuda[:N], over the role's "
        "`device` (`dverl worker --device` wins over both)",
    )

    cpus: float | None = Field(
        None,
        gt=0,
        alias="DVERL_CPUS",
        description="`dverl run`, or by hand: cores this worker computes on (torch's thread pools); the "
        "smaller of it, the cgroup CPU quota and the CPU affinity wins",
    )

    # -- tuning, set by hand
    workers_file: str | None = Field(
        None,
        alias="DVERL_WORKERS_FILE",
        description="tuning: the scaling file to follow instead of the mounted one",
    )
    workers_poll_s: float = Field(
        5.0, gt=0, alias="DVERL_WORKERS_POLL_S", description="tuning: seconds between reads of workers.yaml"
    )
    p2p_announce: AddressList = Field(
        alias="DVERL_P2P_ANNOUNCE",
        description="tuning: multiaddrs volunteers should dial the coordinator at, comma-separated",
    )
    verify_atol: float | None = Field(
        None,
        gt=0,
        alias="DVERL_VERIFY_ATOL",
        description="tuning: log-prob tolerance of volunteer verification",
    )
    volunteer_poll_s: float = Field(
        2.0,
        gt=0,
        alias="DVERL_VOLUNTEER_POLL_S",
        description="tuning: seconds between DHT reads for volunteers",
    )
    partial_every_s: float = Field(
        2.0,
        ge=0,
        alias="DVERL_PARTIAL_EVERY_S",
        description="tuning: seconds between a rollout worker's prefixes of unfinished answers (0: each)",
    )
    wait_volunteers: str | None = Field(
        None,
        alias="DVERL_WAIT_VOLUNTEERS",
        pattern=r"^\d+(:\d+(\.\d+)?)?$",
        description="tuning: `N[:SECONDS]`, start training once N volunteers are active (tests, benchmarks)",
    )
    metrics_port: int | None = Field(
        None,
        alias="DVERL_METRICS_PORT",
        description="plan, learner: serve the training metrics for Prometheus on this port (/metrics)",
    )
    cache_dir: str | None = Field(
        None, alias="DVERL_CACHE_DIR", description="tuning: converted models (default ~/.cache/dverl/models)"
    )
    vllm_eager: bool = Field(
        False, alias="DVERL_VLLM_EAGER", description="tuning: `1` starts vLLM without torch.compile"
    )
    fixed_threads: bool = Field(
        False,
        alias="DVERL_FIXED_THREADS",
        description="tuning: `1` keeps torch's thread count as sized at start, even while other programs "
        "keep some of the cores busy (by default a worker computes on the cores they leave free)",
    )
    span_addrs: str | None = Field(
        None,
        alias="DVERL_SPAN_ADDRS",
        description="plan, rollout with spans: its span servers, spans `;`-separated, replicas `,`-separated",
    )

    @field_validator(
        "rollout_addrs",
        "reward_addrs",
        "reference_addrs",
        "critic_addrs",
        "rollout_pools",
        "reward_pools",
        "reference_pools",
        "critic_pools",
        "p2p_announce",
        mode="before",
    )
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part for part in value.split(",") if part)
        return value

    @field_validator("vllm_eager", "fixed_threads", "gpu_shared_with_learner", mode="before")
    @classmethod
    def _flag(cls, value: object) -> object:
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerSettings:
        environ = os.environ if environ is None else environ
        names = {field.alias for field in cls.model_fields.values()}
        try:
            return cls.model_validate({k: v for k, v in environ.items() if k in names})
        except ValidationError as exc:
            problems = "; ".join(
                f"{err['loc'][0]}: {err['msg']} (got {err.get('input')!r})" for err in exc.errors()
            )
            raise SettingsError(f"worker environment: {problems}") from None

    def addresses(self, role: str) -> list[str]:
        """`host:port` of a serving role's workers, as the plan listed them."""
        return list(getattr(self, f"{role}_addrs"))

    def pools(self, role: str) -> list[str]:
        return list(getattr(self, f"{role}_pools"))

    def server_host(self) -> str:
        if self.bind_host:
            return self.bind_host
        return "0.0.0.0" if self.kubernetes_host is not None else "127.0.0.1"

    def volunteer_wait(self) -> tuple[int, float] | None:
        """(volunteers, seconds) from DVERL_WAIT_VOLUNTEERS, or None."""
        if not self.wait_volunteers:
            return None
        count, _, seconds = self.wait_volunteers.partition(":")
        return int(count), float(seconds or 300)


def env_name(field: str) -> str:
    """The variable behind a settings field (writers use this, so a name is spelled once)."""
    return WorkerSettings.model_fields[field].alias  # type: ignore[return-value]


def settings_table() -> str:
    """docs/environment.md's table of the worker environment."""
    rows = ["| variable | what |", "|---|---|"]
    for field in WorkerSettings.model_fields.values():
        rows.append(f"| `{field.alias}` | {field.description} |")
    return "\n".join(rows)
