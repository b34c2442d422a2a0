"""The order of teardown, in one place, with the reason for each position (reference §8).

Each step re-lists its kind right before deleting, because earlier steps free or create things (ENIs become
`available` when nodes go; an LB appears as "left over" only once the controller has stopped).
"""

from __future__ import annotations

from fsdpkit.ops.teardown.kinds import (
    cluster,
    ebs_volumes,
    ecr,
    enis,
    fsx,
    instances,
    k8s_objects,
    load_balancers,
    log_groups,
    nodegroups,
    s3,
    security_groups,
    stacks,
    tagged,
    target_groups,
)
from fsdpkit.ops.teardown.model import Kind

KINDS: tuple[Kind, ...] = (
    # 1. Kubernetes objects first, while the Load Balancer Controller and the CSI drivers still run, so they
    #    delete the LBs, target groups, SGs, EBS volumes and FSx file systems they made (pitfalls 1, 2, 8, 9).
    k8s_objects.KIND,
    # 2. Node groups before the cluster: EKS refuses "Cluster has nodegroups attached" (pitfall 4). Their
    #    instances' ENIs and volumes are released with them.
    nodegroups.KIND,
    # 3. Instances the kit owns outside node groups (self-managed nodes, a p5 started by hand): they bill by
    #    the hour, hold ENIs in the subnets and use the security groups.
    instances.KIND,
    # 4. The cluster: after it, nothing recreates controller resources or the control-plane log group. Just
    #    before, its controllers' resources get the kit tag, so a rerun still owns them
    # (fsdpkit.ops.teardown.adopt).
    cluster.KIND,
    # 5. Load balancers the controller left: they hold ENIs/public IPs in the subnets and use controller SGs.
    load_balancers.KIND,
    # 6. Target groups after their LBs: a listener's target group answers ResourceInUse.
    target_groups.KIND,
    # 7. EBS volumes from PVCs (Retain outlives the cluster); nodes are gone, so they are detached.
    ebs_volumes.KIND,
    # 8. FSx (final backup optional): its ENIs block the subnets; no waiter, so it is polled until gone.
    fsx.KIND,
    # 9. Leftover ENIs once nodes, LBs and FSx have released theirs; they block SG/subnet/VPC deletion.
    enis.KIND,
    # 10. Controller SGs after everything that used them (ENIs, LBs); referencing rules are revoked first.
    security_groups.KIND,
    # 11. Log groups after the cluster (the control plane recreates its group while it logs, pitfall 10).
    log_groups.KIND,
    # 12. ECR repositories with their images: CloudFormation cannot delete a non-empty repository.
    ecr.KIND,
    # 13. S3 only with --delete-data, before stacks: CloudFormation cannot delete a non-empty bucket.
    s3.KIND,
    # 14. Stacks last, importers before exporters; everything that blocked them is gone by now (pitfall 5, 7).
    stacks.KIND,
    # 15. Everything else the kit tagged (no deleter: a VPC outside a stack, backups): listed as kept, so the
    #     plan shows all of it and a rerun says what is left.
    tagged.KIND,
)

KIND_NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
