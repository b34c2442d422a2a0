"""The Kubernetes labels the kit's parts agree on: k8s renders them, infra puts them on its own objects,
teardown deletes only what carries them."""

from __future__ import annotations

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kit"
"""On everything the kit renders, its namespaces included: teardown deletes Kubernetes objects only in the
namespaces that carry it (fsdpkit.ops.teardown.kube)."""
RUN_ID_LABEL = "kit.io/run-id"
"""The run a pod belongs to: the run's NetworkPolicy admits only pods with its value."""
