"""The data every resource kind shares: what teardown found, what it decided, and what happened.

Each kind (one module per kind, `ops/teardown/kinds/`) fills a `Kind`:
  list(aws, scope) -> list[Resource]       candidates in the kit's scope (tags, VPC, cluster)
  delete(aws, resource, scope) -> None     starts the deletion; raises the AWS error
  state(aws, resource) -> (State, detail)  polled until "gone" (None: deletion is synchronous)
The shared `filters.plan(resources, filters)` decides delete/keep, and `strategies.run_step` turns every
planned item into a `Result`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from fsdpkit.ops.aws import Aws

Action = Literal["delete", "keep"]
Status = Literal["deleted", "gone", "kept", "failed"]
"""deleted: removed by this run; gone: already absent; kept: left on purpose; failed: still there."""
State = Literal["gone", "deleting", "failed"]


class Unavailable(Exception):
    """A kind cannot be listed here (e.g. kubectl missing); the step is skipped with this reason."""


class DeleteFailed(Exception):
    """The service reported a terminal failure (e.g. a stack in DELETE_FAILED), with its reason."""


@dataclass(frozen=True, kw_only=True)
class Options:
    """What the user asked for on the command line (validated by the CLI)."""

    delete_data: bool = False
    """Also empty and delete kit-tagged S3 buckets, and delete the EBS volumes kept as data (a PV's `Retain`,
    a claim outside the kit's namespaces, an unknown reclaim policy, `kit:keep-data`); kept by default."""
    fsx_backup: bool = True
    """Take a final backup of persistent FSx file systems before deleting them (kept, billed as backup)."""
    timeout_s: float = 1800.0
    """Seconds one step may take (dependency retries plus waiting for deletions)."""
    poll_s: float = 10.0
    """Seconds between status polls while waiting for deletions."""
    backoff_s: float = 5.0
    """First delay before retrying a dependency error; doubles up to `backoff_max_s`."""
    backoff_max_s: float = 60.0
    """Longest delay between dependency retries."""
    kinds: tuple[str, ...] = ()
    """Only these kinds (empty = all)."""
    kubectl: str = "kubectl"
    """kubectl binary for the Kubernetes step."""


@dataclass(frozen=True, kw_only=True)
class PvFacts:
    """A PersistentVolume backed by an EBS volume, as a live kit cluster reports it."""

    name: str
    reclaim: str
    """`Retain`, `Delete` (or `Recycle`): `Retain` means a user keeps the volume after its claim."""
    claim_namespace: str = ""
    claim: str = ""
    """`namespace/name` of the claim it is bound to; empty when unbound."""


@dataclass(frozen=True, kw_only=True)
class ClusterFacts:
    """What teardown read from a live kit cluster before deleting anything (fsdpkit.ops.teardown.kube)."""

    context: str
    """The kubeconfig context whose server is the cluster's endpoint."""
    namespaces: frozenset[str] = frozenset()
    """The kit's own namespaces: labelled `app.kubernetes.io/managed-by=kit`, never a shared one."""
    volumes: Mapping[str, PvFacts] = field(default_factory=dict)
    """EBS volume id -> the PersistentVolume that uses it."""


@dataclass(frozen=True, kw_only=True)
class Scope:
    """Who owns what: the prefix, where, and the kit's clusters and VPCs found at the start of the run."""

    prefix: str
    region: str
    account: str
    clusters: tuple[str, ...] = ()
    """Names of EKS clusters tagged kit:project=<prefix>; their controllers' tags mark owned resources."""
    cluster_endpoints: Mapping[str, str] = field(default_factory=dict)
    """API server URL per kit cluster (to find the kubeconfig context)."""
    former_clusters: tuple[str, ...] = ()
    """Kit clusters that no longer exist, named by the kit's stacks (live, or deleted: CloudFormation keeps a
    deleted stack readable for 90 days) and not reused by a cluster alive now: what their controllers left
    is still the kit's, after the cluster is gone (deleted by a first run, `cdk destroy` or the console)."""
    former_deleted_at: Mapping[str, datetime] = field(default_factory=dict)
    """Former cluster -> when the kit stack that named it was deleted: a resource made after that (by a later
    cluster reusing the name) is not the kit's. Absent: no bound known (a live stack still names it)."""
    vpcs: tuple[str, ...] = ()
    """VPC ids tagged kit:project=<prefix>; controller-made ENIs, SGs, LBs and FSx live there."""
    subnets: tuple[str, ...] = ()
    """Subnet ids of those VPCs (FSx reports subnets, not VPCs)."""
    stack_resources: frozenset[str] = frozenset()
    """Physical ids of the resources in the kit's stacks (owned even if a tag is missing)."""
    stack_contents: Mapping[str, str] = field(default_factory=dict)
    """Stack name -> the resources it deletes with it, by type (for the plan)."""
    kube: Mapping[str, ClusterFacts] = field(default_factory=dict)
    """Live kit cluster -> its namespaces and PersistentVolumes, read through kubectl at the start."""
    kube_unread: Mapping[str, str] = field(default_factory=dict)
    """Live kit cluster -> why it could not be read (kubectl missing, no context, no answer)."""
    options: Options = field(default_factory=Options)

    @property
    def owner_clusters(self) -> tuple[str, ...]:
        """Clusters whose controllers' tags mean "the kit's": live kit clusters and former ones."""
        return self.clusters + self.former_clusters


@dataclass(frozen=True, kw_only=True)
class Resource:
    """One thing teardown may delete."""

    kind: str
    id: str
    """The identifier the delete call takes (id, ARN, name)."""
    name: str = ""
    """A human label (Name tag, stack name); may be empty."""
    tags: Mapping[str, str] = field(default_factory=dict)
    detail: Mapping[str, Any] = field(default_factory=dict)
    """Kind-specific facts: vpc_id, subnet_ids, protected (a reason), is_data, stack_id, cluster, created
    (a datetime, where the service says when it was made), ..."""

    @property
    def label(self) -> str:
        return f"{self.id} ({self.name})" if self.name and self.name != self.id else self.id


@dataclass(frozen=True, kw_only=True)
class Decision:
    resource: Resource
    action: Action
    reason: str
    """Why: the ownership evidence for delete, the rule for keep."""


@dataclass(frozen=True, kw_only=True)
class Result:
    resource: Resource
    status: Status
    reason: str
    seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """What a kind's `prepare` did before its deletes."""

    notes: list[str] = field(default_factory=list)
    """Side actions taken (rules revoked, tags written), for the report."""
    keep: Mapping[str, str] = field(default_factory=dict)
    """Resource id -> why it must not be deleted after all (e.g. its controllers' resources could not be
    tagged, so deleting the cluster would leave them unclaimable); reported as kept."""


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One resource kind: a name, its list/delete/state functions and how it is ordered inside its step."""

    name: str
    title: str
    list: Callable[[Aws, Scope], list[Resource]]
    delete: Callable[[Aws, Resource, Scope], None]
    state: Callable[[Aws, Resource], tuple[State, str]] | None = None
    """Polled after delete until "gone"; None when the delete call is synchronous."""
    waves: Callable[[Aws, list[Resource]], list[list[Resource]]] | None = None
    """Groups deleted one after the other (stacks: importers before exporters); None = one group."""
    prepare: Callable[[Aws, list[Resource], Scope], Prepared] | None = None
    """Runs once before the deletes of a step (e.g. revoke rules that reference doomed SGs)."""
