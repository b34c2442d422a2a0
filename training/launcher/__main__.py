"""`python -m fsdpkit.launcher [FLAGS] -m MODULE | SCRIPT ARGS...` (`kit-launch`): the heartbeat launcher."""

from fsdpkit.launcher.cli import entry

entry()
