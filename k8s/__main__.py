"""`python -m k8s ...`: see k8s/cli.py."""

import sys

from k8s.cli import main

sys.exit(main())
