"""Process exit codes shared by the trainer, the launcher and the Job's pod failure policy.

Values follow sysexits.h so a Kubernetes `podFailurePolicy` can tell "retry" from "never retry".
"""

OK = 0
USAGE = 2  # bad command line (argparse's own code)
RUN_FAILED = 69  # EX_UNAVAILABLE: the run this pod was to join (or rejoin) ended in failure: a launcher
# closed the rendezvous after spending its budget (or a fatal error) and recorded why; a new pod cannot
# help, so the Job's pod failure policy fails the Job (exiting 0 would mark the index succeeded)
BUDGET_EXHAUSTED = 75  # EX_TEMPFAIL: the launcher gave its node up (a spare or the new pod takes its
# place), or spent its restart budget (the run is then closed as failed: the new pod exits RUN_FAILED)
FATAL_CONFIG = 78  # EX_CONFIG: a bad config or path; restarting cannot help
DRAINED = 128 + 15  # as if SIGTERM had ended it, after the job committed the agreed step (a drained pod)
