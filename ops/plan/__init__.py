"""`make plan`: what a cluster will lose to failures and checkpoints before it is rented (docs/plan.md)."""
