"""The child `environments.apart` runs user environments in: one JSON request per line of stdin, one JSON
reply per line on the descriptor stdout was at start (the environment's own prints go to stderr, so they
cannot forge a reply). It holds no secret of the process that started it."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from typing import Any

from decentralized_verl.environments import registry
from decentralized_verl.environments.base import EpisodeRecord, StepResult


def _answer(request: dict[str, Any], envs: dict[int, Any], made: list[int]) -> Any:
    op = request["op"]
    if op == "make":
        made[0] += 1
        envs[made[0]] = registry.make_environment(request["name"], request["options"])
        return made[0]
    if op == "preflight":
        registry.preflight(request["name"], request["options"])
        return None
    if op == "instructions":
        return registry.instructions(request["name"])
    env = envs[request["id"]]
    if op == "reset":
        env.reset(EpisodeRecord(**request["record"]))
        return None
    if op == "step":
        result = env.step(request["turn"])
        if not isinstance(result, StepResult):
            return type(result).__name__
        return asdict(result)
    raise ValueError(f"unknown call {op!r}")


def main() -> None:
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    envs: dict[int, Any] = {}
    made = [0]
    for line in sys.stdin:
        request = json.loads(line)
        for handle in request.get("forget", ()):
            envs.pop(handle, None)
        try:
            reply = {"value": _answer(request, envs, made)}
            json.dumps(reply)
        except Exception as exc:  # the caller reports it as the environment's error
            if isinstance(exc, ValueError):  # a named problem (options, import): its message alone
                reply = {"error": str(exc)[:2000], "kind": "ValueError"}
            else:
                reply = {"error": f"{type(exc).__name__}: {exc}"[:2000], "kind": type(exc).__name__}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
