"""What `dverl run` tells the person running a job open to volunteers: that the job's join secret must be
given before anything starts, and, once the job's DHT is up, the command a volunteer runs to join it.

A volunteer can join only while the job runs, at the DHT address this run's bootstrap peer prints (a new
one each run), with a token signed by the job's secret: the supervisor has all three, so it says them.
"""

from __future__ import annotations

import re
from pathlib import Path

from decentralized_verl.errors import ManifestError, Problem
from decentralized_verl.settings import WorkerSettings, env_name
from decentralized_verl.volunteers.tokens import MAKE_SECRET

INITIAL_PEERS = re.compile(r"--initial-peers (\S+)")


def secret_problems(spec, settings: WorkerSettings) -> list[Problem]:
    """A job open to volunteers needs its join secret in this process's environment (the learner signs
    in to the job's DHT with the identity only the secret gives)."""
    if not spec.volunteers.enabled or settings.join_secret_file or settings.join_secret:
        return []
    file = "job-secret"
    return [
        Problem(
            "spec.volunteers.enabled",
            f"a job open to volunteers needs its join secret in {env_name('join_secret_file')} (or "
            f"{env_name('join_secret')}): {MAKE_SECRET.format(file=file)}",
        )
    ]


def refuse_without_secret(spec, manifest: Path, settings: WorkerSettings) -> None:
    problems = secret_problems(spec, settings)
    if problems:
        raise ManifestError(problems, str(manifest))


class VolunteerInvite:
    """Reads the DHT worker's log until it names its address, then returns the join command once."""

    def __init__(self, job: str, dht_log: Path | None, secret_file: str | None) -> None:
        self.job = job
        self.dht_log = dht_log
        self.secret_file = secret_file or "job-secret"
        self.done = dht_log is None

    def line(self) -> str | None:
        if self.done or self.dht_log is None:
            return None
        try:
            found = INITIAL_PEERS.search(self.dht_log.read_text(errors="replace"))
        except OSError:
            return None
        if found is None:
            return None
        self.done = True
        token = f'"$(dverl token --job {self.job} --secret-file {self.secret_file})"'
        return (
            f"volunteers join this job while it runs with: dverl worker --initial-peers {found.group(1)} "
            f"--job {self.job} --token {token} --role rollout"
        )
