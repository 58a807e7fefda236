"""What a job's coordinator remembers of who may volunteer: which join token each peer redeemed, the peers
and tokens it blocked, and every accepted Join by token; kept in a file beside the checkpoints and taken
up by a resumed learner, so a learner restart forgets no block and no redemption.

A token is redeemed by one peer identity, and a block follows the token: a blocked volunteer cannot come
back under a fresh peer id with it. The hub (`discovery.py`) decides who joins; this is its memory.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decentralized_verl.errors import DverlError

log = logging.getLogger(__name__)

ADMISSION_FILE = "volunteer_admission.json"
"""In the learner's output folder, beside its checkpoints."""
ADMISSION_FORMAT = 1


class VolunteerAdmissionError(DverlError):
    """The admission state a resumed learner must take up is missing a part or not this job's."""


@dataclass
class AdmissionLedger:
    job: str
    redeemed: dict[str, str] = field(default_factory=dict)
    """Join token nonce -> the one peer id that redeemed it."""
    blocked: dict[str, str] = field(default_factory=dict)
    """Peer id -> why it was blocked."""
    blocked_tokens: dict[str, str] = field(default_factory=dict)
    """Join token nonce -> why: the tokens of blocked peers, refused whatever peer id brings them."""
    token_history: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Join token nonce -> {"joins": n, "first": t, "last": t}: every accepted Join made with it."""
    path: Path | None = None
    """Where it is written whenever it changes (None: kept in memory only)."""

    def holder(self, nonce: str) -> str | None:
        return self.redeemed.get(nonce)

    def redeem(self, nonce: str, peer_id: str, now: float) -> None:
        """An accepted Join: the token is this peer's from now on."""
        self.redeemed[nonce] = peer_id
        history = self.token_history.setdefault(nonce, {"joins": 0, "first": now})
        history["joins"] += 1
        history["last"] = now
        self.save()

    def block(self, peer_id: str, nonce: str, reason: str) -> bool:
        """Block a peer and the token it redeemed ("" when none); False when it was blocked already."""
        if peer_id in self.blocked:
            return False
        self.blocked[peer_id] = reason
        if nonce:
            self.blocked_tokens[nonce] = f"its holder {peer_id} was blocked: {reason}"
        self.save()
        return True

    def state(self) -> dict[str, Any]:
        return {
            "format": ADMISSION_FORMAT,
            "job": self.job,
            "redeemed": dict(self.redeemed),
            "blocked": dict(self.blocked),
            "blocked_tokens": dict(self.blocked_tokens),
            "token_history": {nonce: dict(h) for nonce, h in self.token_history.items()},
        }

    def keep(self, path: Path, *, restore: bool) -> None:
        """Write the state to `path` whenever it changes; with `restore`, take up what is there first (a
        resumed learner). A file that is not this job's admission state is an error naming it: starting
        without the blocks it holds would let a blocked volunteer back in."""
        self.path = path
        if restore and path.exists():
            try:
                state = json.loads(path.read_text())
                if state.get("format") != ADMISSION_FORMAT or state.get("job") != self.job:
                    raise ValueError(f"not format {ADMISSION_FORMAT} admission state of job {self.job}")
                self.redeemed.update({str(k): str(v) for k, v in state["redeemed"].items()})
                self.blocked.update({str(k): str(v) for k, v in state["blocked"].items()})
                self.blocked_tokens.update({str(k): str(v) for k, v in state["blocked_tokens"].items()})
                self.token_history.update({str(k): dict(v) for k, v in state["token_history"].items()})
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise VolunteerAdmissionError(
                    f"{path}: cannot take up the volunteers' admission state ({exc})"
                ) from None
            log.info(
                "volunteer admission taken up from %s: %d tokens redeemed, %d peers and %d tokens blocked",
                path, len(self.redeemed), len(self.blocked), len(self.blocked_tokens),
            )  # fmt: skip
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.state(), indent=1) + "\n")
        os.replace(tmp, self.path)
