"""`python_tool`: the model runs Python by writing a ```python block; stdout and stderr come back.

Each block runs in the reward sandbox (`rewards.sandbox.run_python`): a child process with a scrubbed
environment (no credentials of the worker), a private temp dir, CPU / memory / wall-clock / output limits,
no network, no process creation, no reads outside the stdlib. A turn without a ```python block is the
final answer, scored against the record's reference (`answers.py`). A program that fails (an exception,
a timeout, a refused operation) is a tool error whose message is the observation.
"""

from __future__ import annotations

from typing import ClassVar

from decentralized_verl.environments.answers import score_answer
from decentralized_verl.environments.base import EpisodeRecord, StepInfo, StepResult
from decentralized_verl.rewards.extract import last_python_block
from decentralized_verl.rewards.sandbox import SandboxLimits, run_python
from decentralized_verl.spec.catalogue.environments import PythonToolOptions


class PythonTool:
    """Sandboxed Python on request; the final answer is scored against the record's."""

    Options = PythonToolOptions
    instructions: ClassVar[str] = (
        "You can run Python: write a ```python code block and its output comes back. "
        "When you know the answer, reply with it without a code block."
    )

    def __init__(self, options: PythonToolOptions | None = None) -> None:
        self.options = options or PythonToolOptions()
        self.record: EpisodeRecord | None = None
        o = self.options
        self.limits = SandboxLimits(
            wall_time_s=o.timeout_s,
            cpu_time_s=o.cpu_time_s,
            memory_bytes=o.memory_mb * 1024 * 1024,
            max_output_bytes=max(4 * o.max_output_chars, 4096),
        )

    def reset(self, record: EpisodeRecord) -> None:
        self.record = record

    def step(self, turn: str) -> StepResult:
        assert self.record is not None, "reset before step"
        code = last_python_block(turn)
        if code is None:
            reward, why = score_answer(
                turn, self.record.ground_truth, self.options.answer_reward, prompt=self.record.prompt_text
            )
            return StepResult(None, reward, done=True, info=StepInfo(reason=f"answered: {why}"))
        outcome = run_python(code, "", self.limits)
        failed = outcome.status != "ok"
        return StepResult(
            self._observation(outcome.status, outcome.stdout, outcome.stderr),
            info=StepInfo(tool_calls=1, tool_errors=int(failed), reason=outcome.status),
        )

    def _observation(self, status: str, stdout: str, stderr: str) -> str:
        limit = self.options.max_output_chars
        parts = []
        if stdout:
            parts.append(_clip(stdout, limit))
        if status != "ok":
            detail = _clip(stderr.strip(), limit // 2, keep="end") if stderr.strip() else ""
            parts.append(f"[{_STATUS_TEXT.get(status, status)}]" + (f"\n{detail}" if detail else ""))
        elif stderr.strip():
            parts.append("[stderr]\n" + _clip(stderr.strip(), limit // 2, keep="end"))
        return "\n".join(parts) if parts else "[no output]"


_STATUS_TEXT = {
    "error": "the program failed",
    "timeout": "the program ran out of time",
    "cpu_limit": "the program ran out of CPU time",
    "output_limit": "the program printed too much",
    "sandbox_error": "the sandbox could not start",
}


def _clip(text: str, limit: int, keep: str = "start") -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + "\n[...cut]" if keep == "start" else "[cut...]\n" + text[-limit:]
