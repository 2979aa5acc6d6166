import sys

from deploy.acceptance.fairness.run import main

sys.exit(main())
