"""Process exit codes shared by the trainer, the launcher and the Job's pod failure policy.

Values follow sysexits.h so a Kubernetes `podFailurePolicy` can tell "retry" from "never retry".
"""

OK = 0
USAGE = 2  # bad command line (argparse's own code)
BUDGET_EXHAUSTED = 75  # EX_TEMPFAIL: the launcher spent its restart budget; a new pod may succeed
FATAL_CONFIG = 78  # EX_CONFIG: a bad config or path; restarting cannot help
DRAINED = 128 + 15  # as if SIGTERM had ended it, after the job committed the agreed step (a drained pod)
