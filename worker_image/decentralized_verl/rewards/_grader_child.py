"""Child process that runs math-verify on one comparison per line of stdin (JSON in, JSON out).

Run by `equivalence.MathVerifyProcess`; kept in its own process because sympy can spin on hostile input
in C code that no signal interrupts, and math-verify's own timeout (signal.alarm) works only in a main
thread. Here we are the main thread, so its timeouts work, and the parent kills us if they do not.
"""

from __future__ import annotations

import json
import sys

from math_verify import parse, verify


def _parse(parse, text: str, timeout: int) -> list:
    parsed = parse(f"${text}$", parsing_timeout=timeout)
    return parsed or parse(text, parsing_timeout=timeout)


def main() -> None:
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            timeout = max(1, int(request["timeout"]))
            gold = _parse(parse, request["gold"], timeout)
            pred = _parse(parse, request["pred"], timeout)
            if not gold or not pred:
                side = "gold" if not gold else "pred"
                reply = {"equal": None, "why": f"math-verify could not parse {side}"}
            else:
                reply = {"equal": bool(verify(gold, pred, timeout_seconds=timeout)), "why": "math-verify"}
        except Exception as exc:  # one bad comparison must not end the process
            reply = {"equal": None, "why": f"math-verify error: {type(exc).__name__}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
