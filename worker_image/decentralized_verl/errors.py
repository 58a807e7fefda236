"""One project error type per boundary, so the CLI can print any of them and exit 2.

Each error's text names the place (field path, file:line, peer, tensor) a person must look at.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
"""How every `dverl` process ends: success, a run or operation that failed, usage or invalid input, ^C."""
EXIT_REFIT_PARITY = 3
"""How a learner ends when a weight refresh failed its parity check: not a crash to restart from a
checkpoint (the next refresh would go the same way) but a failed job (`dverl run` stops)."""
BAD_INPUT_REASON = "BadInput"
"""The word the operator's Failed condition and event give a failure a person must fix (a `dverl` exit 2,
or the coordinator's Status reply naming a `DverlError`), whichever way it hears of it first."""
REFIT_PARITY_REASON = "RefitParityFailed"
"""The one word the operator's Failed condition and event give that failure, whichever way it hears of it
first: the coordinator's Status reply or the learner pod's exit code."""


class DverlError(Exception):
    """Base of every error a user can act on; the CLI prints it without a traceback."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest: the dotted field path and what is wrong there."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ManifestError(DverlError):
    """An RLHFJob manifest (or a stage config) that cannot be used; carries every problem found."""

    def __init__(self, problems: list[Problem], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + "; ".join(str(p) for p in self.problems))


class DataError(DverlError):
    """A data file or record that cannot be read; the message names file, line/row and field."""


class WireError(DverlError):
    """A gRPC / P2P message that breaks the contract; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class ModelError(DverlError):
    """A model that cannot be located or loaded; the message names the spec field."""


class CheckpointError(DverlError):
    """A checkpoint that cannot be written, trusted or exported; the message names the folder and file."""


class RewardFailed(DverlError):
    """The job's reward function fails on every sample, step after step; the message names the reward and
    its error. Input to fix (the function or its data), so the CLI exits 2 and nothing restarts the job."""


class VolunteerError(DverlError):
    """An untrusted peer's result or join request that is rejected; the message names the peer."""


class OperationFailed(DverlError):
    """A run or operation that started from valid input and then failed; the CLI exits 1 for it (2 is
    kept for usage and input a person must fix)."""


class PeerUnavailable(VolunteerError, OperationFailed):
    """A peer this process needs could not be reached: the command failed (exit 1), its input was fine."""
