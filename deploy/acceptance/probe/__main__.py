"""``python -m deploy.acceptance.probe``: the probe's command line (run.py)."""

import sys

from deploy.acceptance.probe.run import main

sys.exit(main())
