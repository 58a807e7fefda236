"""Who may call what: each role of a job holds its own token, and each gRPC method names the roles that
may call it. A right is here only because the role needs it:

- the learner (the coordinator) drives every worker: Generate, Info, Score, LogProbs, Values, Train,
  Push, and asks workers whether they are Ready;
- a rollout worker pulls weights (GetManifest, Fetch) from the learner or a peer, and as a relay forwards
  the learner's signed pushes (Push, BulkOpen) to the next worker of its chain;
- the observer (the operator's Status client, `dverl run` watching its learner) reads Status and Ready;
- a rollout worker whose policy is served as a chain of layer spans drives its span servers (Span/*);
- reward, reference, critic and span workers answer calls and make none.

Nobody is given the Volunteer service over gRPC: volunteers join over the DHT (`volunteers/`).
A token of one role is no use for another's calls, so breaking into a rollout pod gives no way to choose
what the reward worker scores, to train the critic, or to read Status.
"""

from __future__ import annotations

TOKEN_ROLES = ("learner", "rollout", "reward", "reference", "critic", "span", "observer")
"""Roles that hold a token; a process of any other role (the DHT bootstrap) holds none."""

_WEIGHTS_PULL = frozenset({"Weights/GetManifest", "Weights/Fetch"})
_WEIGHTS_FORWARD = frozenset({"Weights/Push", "Weights/BulkOpen"})
_SPAN_CHAIN = frozenset({"Span/Forward", "Span/Close", "Span/Info", "Span/Stage", "Span/Commit"})

RIGHTS: dict[str, frozenset[str]] = {
    "learner": frozenset(
        {
            "Rollout/Generate",
            "Rollout/Info",
            "Reward/Score",
            "Reference/LogProbs",
            "Critic/Values",
            "Critic/Train",
            "Health/Ready",
            "Coordinator/Status",
        }
    )
    | _WEIGHTS_PULL
    | _WEIGHTS_FORWARD,
    "rollout": _WEIGHTS_PULL | _WEIGHTS_FORWARD | _SPAN_CHAIN,
    "reward": frozenset(),
    "reference": frozenset(),
    "critic": frozenset(),
    "span": frozenset(),
    "observer": frozenset({"Coordinator/Status", "Health/Ready"}),
}
assert set(RIGHTS) == set(TOKEN_ROLES)


def method_key(path: str) -> str:
    """`/dverl.v1.Weights/Push` -> `Weights/Push`."""
    service, _, name = path.lstrip("/").partition("/")
    return f"{service.rsplit('.', 1)[-1]}/{name}"


def may_call(role: str, path: str) -> bool:
    return method_key(path) in RIGHTS.get(role, frozenset())
