"""`python -m fsdpkit.k8s ...`: see k8s/cli.py."""

import sys

from fsdpkit.k8s.cli import main

sys.exit(main())
