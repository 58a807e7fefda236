"""`python -m dverl_operator` = `dverl operator` (tests start the operator this way)."""

import sys

from dverl_operator.main import main

sys.exit(main())
