"""The child `rewards.apart` runs user reward functions in: one JSON request per line of stdin, one JSON
reply per line of stdout. It holds no secret of the process that started it."""

from __future__ import annotations

import json
import sys

from decentralized_verl.rewards.custom import call_custom
from decentralized_verl.rewards.registry import reward_function


def check(name: str) -> int:
    """`--check NAME`: whether the user's function imports, its problem on stderr (exit 2) if not."""
    try:
        reward_function(name)
    except (ValueError, ImportError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


def main() -> None:
    if sys.argv[1:2] == ["--check"]:
        raise SystemExit(check(sys.argv[2]))
    for line in sys.stdin:
        request = json.loads(line)
        result = call_custom(
            request["spec"],
            request["completion"],
            request["reference"],
            request["prompt"],
            request["options"],
        )
        details = result.details
        try:
            json.dumps(details)
        except (TypeError, ValueError):
            details = None
        sys.stdout.write(
            json.dumps({"score": result.score, "reason": result.reason, "details": details}) + "\n"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
