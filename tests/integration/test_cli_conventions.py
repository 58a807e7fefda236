"""What a user of any Unix CLI expects of `dverl`: help and defaults for every argument, one name per
idea, exit codes that tell a failed run (1) from bad input (2), quiet on a closed pipe, --json where
machines read, and plain progress lines when stderr is not a terminal.

Here the ones with real processes and servers; the pure checks in tests/unit/, under the same name.
"""

from __future__ import annotations

import subprocess
import sys


def test_closed_pipe_ends_quietly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "decentralized_verl.cli", "crd"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader is gone before the command writes its first line, as with `| head -0`
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert proc.returncode == 141
