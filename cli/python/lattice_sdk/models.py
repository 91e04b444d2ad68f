"""The API's objects as dataclasses: what a request sends (``AllocationSpec``) and what answers hold.

Each answer model keeps the fields the API documents and puts anything newer in ``extra``, so a newer
server never breaks an older client.
"""

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional


def _from(cls, data: Dict[str, Any]):
    names = {f.name for f in fields(cls)} - {"extra"}
    known = {k: v for k, v in data.items() if k in names}
    obj = cls(**known)
    obj.extra = {k: v for k, v in data.items() if k not in names}
    return obj


@dataclass
class DataMount:
    """``source`` (``s3://bucket/key``, ``nfs://home/{user}``) mounted at ``target`` for the processes."""

    source: str
    target: Optional[str] = None
    read_only: bool = False
    tier_hint: Optional[str] = None
    size_gb: Optional[float] = None

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"source": self.source}
        if self.target is not None:
            out["target"] = self.target
            out["access"] = "read-only" if self.read_only else "read-write"
        if self.tier_hint is not None:
            out["tier_hint"] = self.tier_hint
        if self.size_gb is not None:
            out["size_gb"] = self.size_gb
        return out


@dataclass
class AllocationSpec:
    """A submission (``POST /v1/allocations``). ``constraints``: ``gpu_type``, ``gpu_count``, ``features``,
    ``cpu_cores``, ``memory_gb``, ``topology``, ``require_unified_memory``.
    ``task_group``: ``(start, end)`` or ``(start, end, concurrency)``. ``depends_on``: ``{id: condition}``
    with ``success``, ``failure`` or ``any``."""

    entrypoint: str
    nodes: int = 1
    walltime: Optional[str] = "1h"
    tenant: Optional[str] = None
    project: Optional[str] = None
    user: Optional[str] = None
    vcluster: Optional[str] = None
    uenv: Optional[str] = None
    view: Optional[str] = None
    tools_uenv: Optional[str] = None
    image: Optional[str] = None
    constraints: Optional[Dict[str, Any]] = None
    preemption_class: Optional[int] = None
    tags: Dict[str, str] = field(default_factory=dict)
    depends_on: Dict[str, str] = field(default_factory=dict)
    task_group: Optional[tuple] = None
    data_mounts: List[DataMount] = field(default_factory=list)
    data_defaults: Optional[bool] = None
    checkpoint: Optional[Dict[str, Any]] = None
    lifecycle: str = "bounded"
    min_nodes: Optional[int] = None
    max_nodes: Optional[int] = None
    sensitive: bool = False
    network_domain: Optional[str] = None
    #: Named service ports: ``[{"name": "api", "port": 8080, "protocol": "http"}]``.
    expose: List[Dict[str, Any]] = field(default_factory=list)
    #: The service's liveness probe: ``{"probe_type": "http", "port": 8080, "path": "/healthz", ...}``.
    liveness_probe: Optional[Dict[str, Any]] = None
    idempotency_key: Optional[str] = None
    duration: Optional[str] = None
    #: Reactive: the metric it scales on, its target, and the policy's windows
    #: (``{"cooldown": "5m", ...}``).
    metric: Optional[str] = None
    target: Optional[Any] = None
    scale_policy: Optional[Dict[str, Any]] = None
    #: After a node failure: ``never``, ``on_node_failure`` (the default), ``always``.
    requeue: Optional[str] = None
    max_requeues: Optional[int] = None
    #: At most one running allocation holds this name at a time.
    mutex: Optional[str] = None
    #: The storage bandwidth it uses, GB/s.
    storage_gbps: Optional[float] = None

    def to_json(self) -> Dict[str, Any]:
        body: Dict[str, Any] = {
            "entrypoint": self.entrypoint,
            "resources": {"nodes": self.nodes},
            "lifecycle": {"type": self.lifecycle},
        }
        if self.walltime is not None and self.lifecycle == "bounded":
            body["lifecycle"]["walltime"] = self.walltime
        for k in ("min_nodes", "max_nodes", "metric", "target", "scale_policy"):
            if getattr(self, k) is not None:
                body["lifecycle"][k] = getattr(self, k)
        for k in (
            "tenant",
            "project",
            "user",
            "vcluster",
            "preemption_class",
            "idempotency_key",
            "duration",
            "requeue",
            "max_requeues",
            "mutex",
            "storage_gbps",
        ):
            if getattr(self, k) is not None:
                body[k] = getattr(self, k)
        if self.constraints:
            body["resources"]["constraints"] = dict(self.constraints)
        env = {k: getattr(self, k) for k in ("uenv", "view", "tools_uenv", "image") if getattr(self, k) is not None}
        if env:
            body["environment"] = env
        if self.tags:
            body["tags"] = dict(self.tags)
        if self.depends_on:
            body["depends_on"] = [{"ref": r, "condition": c} for r, c in self.depends_on.items()]
        if self.task_group is not None:
            start, end, *rest = self.task_group
            body["task_group"] = {"range": {"start": start, "end": end}}
            if rest:
                body["task_group"]["concurrency"] = rest[0]
        if self.data_mounts or self.data_defaults is not None:
            body["data"] = {"mounts": [m.to_json() for m in self.data_mounts]}
            if self.data_defaults is not None:
                body["data"]["defaults"] = self.data_defaults
        if self.checkpoint:
            body["checkpoint"] = dict(self.checkpoint)
        if self.sensitive:
            body["sensitive"] = True
        if self.network_domain or self.expose:
            body["connectivity"] = {}
            if self.network_domain:
                body["connectivity"]["network_domain"] = self.network_domain
            if self.expose:
                body["connectivity"]["expose"] = [dict(e) for e in self.expose]
        if self.liveness_probe:
            body["liveness_probe"] = dict(self.liveness_probe)
        return body


@dataclass
class Allocation:
    """An allocation as ``GET /v1/allocations/{id}`` shows it."""

    id: str
    state: str
    tenant: str = ""
    vcluster: str = ""
    user: Optional[str] = None
    project: Optional[str] = None
    nodes: List[str] = field(default_factory=list)
    requested_nodes: int = 0
    walltime_s: Optional[float] = None
    preemption_class: int = 0
    submitted_ms: Optional[int] = None
    started_ms: Optional[int] = None
    ended_ms: Optional[int] = None
    end_reason: Optional[str] = None
    entrypoint: Optional[str] = None
    environment: Optional[Dict[str, Any]] = None
    tags: Dict[str, str] = field(default_factory=dict)
    last_rejection: Optional[str] = None
    data_readiness: Optional[float] = None
    vni: Optional[int] = None
    telemetry: str = "prod"
    checkpoints: int = 0
    last_checkpoint_ms: Optional[int] = None
    preempted: int = 0
    preemption: Optional[str] = None
    task_group: Optional[Dict[str, Any]] = None
    #: While it waits: ``reason`` (dependencies, quota, reserved, behind_head, ...) and ``summary``.
    waiting: Optional[Dict[str, Any]] = None
    #: What it waits for: ``[{"ref": allocation id, "condition": success|failure|any}]``.
    depends_on: List[Dict[str, str]] = field(default_factory=list)
    #: Its placement constraints as asked (gpu_type, gpu_count, cpu_cores, memory_gb, features, ...).
    constraints: Optional[Dict[str, Any]] = None
    #: never | on_node_failure | always, and how many times at most.
    requeue: str = "on_node_failure"
    max_requeues: int = 3
    mutex: Optional[str] = None
    storage_gbps: Optional[float] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Allocation":
        return _from(cls, data)

    @property
    def ended(self) -> bool:
        return self.ended_ms is not None


@dataclass
class SubmitResult:
    """A submission's answer: the id (a task group's, with its ``elements``)."""

    id: str
    elements: List[str] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "SubmitResult":
        return _from(cls, data)


@dataclass
class Dag:
    """A DAG: its id, overall state and members (``name`` → allocation id and state)."""

    id: str
    state: Optional[str] = None
    allocations: Any = None
    #: Its members' tenant and user.
    tenant: Optional[str] = None
    user: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Dag":
        return _from(cls, data)


@dataclass
class Node:
    name: str
    state: str
    owner: Optional[str] = None
    #: The vCluster and tenant of the allocation on it.
    vcluster: Optional[str] = None
    tenant: Optional[str] = None
    gpu_type: Optional[str] = None
    gpu_count: int = 0
    cpu_cores: int = 0
    memory_gb: int = 0
    group: int = 0
    #: What its agent discovered where the inventory leaves GPUs, cores or memory unset.
    discovered: Optional[Dict[str, Any]] = None
    fingerprint: Optional[str] = None
    agent_capabilities: Optional[Dict[str, Any]] = None
    fingerprint_ms: Optional[int] = None
    #: Off its conformance baseline: drained until it conforms (OpenCHAMI remediates it).
    drifted: bool = False
    last_partition: Optional[Dict[str, Any]] = None
    #: Where its agent's discovered capabilities disagree with the inventory.
    capability_mismatch: List[str] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Node":
        return _from(cls, data)


@dataclass
class TaskLaunch:
    """A task launch inside an allocation (``lattice launch``): its ranks' exit codes and output."""

    launch_id: str
    allocation: str = ""
    state: Optional[str] = None
    entrypoint: str = ""
    ntasks: int = 0
    exit_codes: List[Any] = field(default_factory=list)
    reason: Optional[str] = None
    output: List[Dict[str, Any]] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "TaskLaunch":
        return _from(cls, data)


@dataclass
class Tenant:
    name: str


@dataclass
class VCluster:
    name: str
