"""What one reconcile pass asks of the cluster: objects to create, patch and delete, the job's complete new
`.status`, Events, and when to look again. `decide` returns it; the loop's I/O side applies it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Actions:
    create: list[dict[str, Any]] = field(default_factory=list)
    patch: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """(kind, name, merge patch) for ConfigMap / Service / Pod."""
    delete: list[tuple[str, str]] = field(default_factory=list)
    """(kind, name)."""
    status: dict[str, Any] = field(default_factory=dict)
    """The complete desired `.status`."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type Normal|Warning, reason, message)."""
    requeue_after: float | None = None
    """Come back sooner than the resync interval (a backoff that ends, pods that terminate)."""
    issue_credentials: bool = False
    """Create the job's credentials Secret (before any pod): issued where it is applied, since it is
    random; an existing one is kept."""

    @property
    def changes_children(self) -> bool:
        """More than status and events: something in the cluster is made, changed or removed."""
        return bool(self.create or self.delete or self.patch or self.issue_credentials)

    def summary(self) -> str:
        return (
            f"{'credentials ' if self.issue_credentials else ''}"
            f"create={[o['metadata']['name'] for o in self.create]} "
            f"delete={[name for _, name in self.delete]} patch={[name for _, name, _ in self.patch]}"
        )
