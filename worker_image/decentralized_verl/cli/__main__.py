"""`python -m decentralized_verl.cli ...`: the `dverl` command, for a process started without the console
script on its PATH (`dverl run`'s local workers, Ray actors)."""

import sys

from decentralized_verl.cli.main import main

sys.exit(main())
