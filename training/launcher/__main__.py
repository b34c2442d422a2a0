"""`python -m training.launcher [FLAGS] -m MODULE | SCRIPT ARGS...`: the kit's heartbeat launcher (cli.py)."""

from training.launcher.cli import main
from training.runtime.process_exit import leave

leave(main())
