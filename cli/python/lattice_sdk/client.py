"""The async client (httpx): one method per API call, answers as models, errors as exceptions."""

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Union
from urllib.parse import quote

import httpx

from .errors import LatticeError, LatticeRateLimitError, from_response
from .models import Allocation, AllocationSpec, Dag, Node, SubmitResult, TaskLaunch, Tenant, VCluster

# States after which an allocation never changes again.
ENDED = ("completed", "failed", "cancelled")


@dataclass
class WatchEvent:
    """A change of an allocation's state seen by :meth:`LatticeClient.watch`."""

    id: str
    state: str
    previous: Optional[str]
    allocation: Allocation


@dataclass
class LogLine:
    """One line of an allocation's output (:meth:`LatticeClient.stream_logs`)."""

    node: str
    stream: str
    message: str


class LatticeClient:
    """A client of one Lattice control plane.

    ``LatticeClient("lattice-api.example.com", 8080)`` or ``LatticeClient(base_url="https://...")``;
    a quorum's members as ``base_url=["https://m1:8080", "https://m2:8080", ...]`` (or one string,
    comma-separated, as ``LATTICE_ENDPOINT``): a member that cannot be reached, or that is not the
    leader (421), is passed over for the next, starting from the one that answered last. A write is
    never sent twice: only a refused connection moves it on; a read also moves on from a member that
    never answered.
    ``token``: a bearer token (OIDC access token); ``verify``: a CA bundle path (or False for no check,
    never in production); ``cert``: a client certificate (``(cert, key)`` paths) for mTLS. A 429 is
    retried after its ``Retry-After`` up to ``retries`` times; transport errors are not retried (a
    submission could run twice — pass ``idempotency_key`` in the spec to make it safe to retry).
    Use as ``async with`` (or call :meth:`aclose`).
    """

    def __init__(
        self,
        host: str = "localhost",
        port: int = 8080,
        token: Optional[str] = None,
        headers: Optional[Dict[str, str]] = None,
        *,
        base_url: Optional[Union[str, Sequence[str]]] = None,
        tls: bool = False,
        verify: Union[bool, str, ssl.SSLContext] = True,
        cert: Optional[Any] = None,
        timeout: float = 30.0,
        retries: int = 3,
        max_retry_wait: float = 60.0,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ):
        if base_url is None:
            base_url = f"{'https' if tls else 'http'}://{host}:{port}"
        h = dict(headers or {})
        if token:
            h["Authorization"] = f"Bearer {token}"
        self.base_urls = members(base_url)
        self._current = 0
        self.retries = retries
        self.max_retry_wait = max_retry_wait
        self._http = httpx.AsyncClient(headers=h, verify=_tls(verify, cert), timeout=timeout, transport=transport)

    @property
    def base_url(self) -> str:
        """The member requests go to first (the one that answered last)."""
        return self.base_urls[self._current]

    async def __aenter__(self) -> "LatticeClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- transport ---------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Optional[Dict[str, Any]] = None,
        headers: Optional[Dict[str, str]] = None,
    ):
        params = {k: v for k, v in (params or {}).items() if v is not None}
        attempt = 0
        while True:
            r = await self._send(method, path, json=json, params=params, headers=headers)
            if r.status_code == 429 and attempt < self.retries:
                attempt += 1
                await asyncio.sleep(min(_retry_after(r), self.max_retry_wait))
                continue
            body = _body(r)
            if r.status_code == 429:
                raise LatticeRateLimitError(
                    str(body.get("error", "rate limit exceeded") if isinstance(body, dict) else body),
                    retry_after=_retry_after(r),
                    status_code=429,
                    body=body,
                )
            if r.status_code >= 400:
                raise from_response(r.status_code, body)
            return body

    async def _send(self, method: str, path: str, **kw) -> httpx.Response:
        """One request, to the members in turn from the one that answered last: passed over when
        it refuses the connection, is not the leader (421), or — a read — never answers."""
        n = len(self.base_urls)
        queue = [self.base_urls[(self._current + k) % n] for k in range(n)]
        seen = set()
        passed = []
        while queue:
            base = queue.pop(0)
            if base in seen:
                continue
            seen.add(base)
            more = any(b not in seen for b in queue)
            try:
                r = await self._http.request(method, base + path, **kw)
            except httpx.ConnectError as e:
                # Never sent: safe to try the next member, a write too.
                if more:
                    passed.append(f"{base}: {e}")
                    continue
                raise LatticeError(f"{method} {base}{path}: {e}" + _after(passed)) from e
            except (httpx.HTTPError, ssl.SSLError, OSError) as e:
                # (A TLS 1.3 server's refusal of the client certificate arrives as an SSLError.)
                if method == "GET" and isinstance(e, httpx.TransportError) and more:
                    passed.append(f"{base}: {e}")
                    continue
                raise LatticeError(f"{method} {base}{path}: {e}" + _after(passed)) from e
            if r.status_code == 421:
                # Not the leader: on to the leader it names (its REST URL), else the next member.
                named = _leader_url(r)
                if named and named not in seen:
                    queue.insert(0, named)
                    passed.append(f"{base}: not the leader")
                    continue
                if more:
                    passed.append(f"{base}: not the leader")
                    continue
                return r
            if base in self.base_urls:
                self._current = self.base_urls.index(base)
            else:
                # A leader a member named: tried first from now on.
                self.base_urls.insert(0, base)
                self._current = 0
            return r
        raise LatticeError(f"{method} {path}: no member answered" + _after(passed))

    # -- allocations -------------------------------------------------------------------------

    async def submit(self, spec: Union[AllocationSpec, Dict[str, Any]]) -> SubmitResult:
        """Submits an allocation (or a task group): its id (and the group's ``elements``)."""
        body = spec.to_json() if isinstance(spec, AllocationSpec) else spec
        return SubmitResult.from_json(await self._call("POST", "/v1/allocations", json=body))

    async def status(self, alloc_id: str) -> Allocation:
        return Allocation.from_json(await self._call("GET", f"/v1/allocations/{_seg(alloc_id)}"))

    get = status

    async def list_allocations(
        self,
        state: Optional[str] = None,
        tenant: Optional[str] = None,
        user: Optional[str] = None,
        vcluster: Optional[str] = None,
        mine: bool = False,
    ) -> List[Allocation]:
        """Allocations the caller sees; ``state`` one or several comma-separated, ``mine`` the
        caller's own only."""
        params = {"state": state, "tenant": tenant, "user": user, "vcluster": vcluster}
        if mine:
            params["mine"] = "true"
        v = await self._call("GET", "/v1/allocations", params=params)
        return [Allocation.from_json(a) for a in v["allocations"]]

    async def cancel(self, alloc_id: str) -> str:
        """Cancels it; its state afterwards."""
        return (await self._call("DELETE", f"/v1/allocations/{_seg(alloc_id)}"))["state"]

    async def update(
        self,
        alloc_id: str,
        walltime: Optional[str] = None,
        tags: Optional[Dict[str, str]] = None,
        telemetry: Optional[Dict[str, Any]] = None,
    ) -> Allocation:
        """Extends the walltime, sets tags (an empty value removes one), switches the telemetry mode."""
        body: Dict[str, Any] = {}
        if walltime is not None:
            body["walltime"] = walltime
        if tags:
            body["tags"] = tags
        if telemetry is not None:
            body["telemetry"] = telemetry
        return Allocation.from_json(await self._call("PATCH", f"/v1/allocations/{_seg(alloc_id)}", json=body))

    async def checkpoint(self, alloc_id: str) -> int:
        """Asks for a checkpoint: the number the allocation has been asked for."""
        return (await self._call("POST", f"/v1/allocations/{_seg(alloc_id)}/checkpoint"))["checkpoints"]

    async def watch(self, alloc_id: str, poll: float = 1.0) -> AsyncIterator[WatchEvent]:
        """Its state changes, the current state first; ends after it ended."""
        previous: Optional[str] = None
        while True:
            a = await self.status(alloc_id)
            if a.state != previous:
                yield WatchEvent(id=a.id, state=a.state, previous=previous, allocation=a)
                previous = a.state
            if a.ended:
                return
            await asyncio.sleep(poll)

    async def wait(self, alloc_id: str, poll: float = 0.5, timeout: Optional[float] = None) -> Allocation:
        """Waits until it ended."""

        async def run() -> Allocation:
            async for e in self.watch(alloc_id, poll=poll):
                if e.allocation.ended:
                    return e.allocation
            raise AssertionError("unreachable")

        return await asyncio.wait_for(run(), timeout)

    # -- logs --------------------------------------------------------------------------------

    async def logs(
        self,
        alloc_id: str,
        stream: str = "stdout",
        node: Optional[str] = None,
        offset: Optional[int] = None,
        limit: Optional[int] = None,
        since: Optional[str] = None,
        until: Optional[str] = None,
    ) -> Dict[str, str]:
        """Its stored output of ``stream`` (stdout or stderr), by node."""
        v = await self._call(
            "GET",
            f"/v1/allocations/{_seg(alloc_id)}/logs",
            params={"stream": stream, "node": node, "offset": offset, "limit": limit, "since": since, "until": until},
        )
        return v["nodes"]

    async def stream_logs(
        self, alloc_id: str, stream: str = "stdout", follow: bool = True, poll: float = 0.5
    ) -> AsyncIterator[LogLine]:
        """Its output line by line as the agents send it (live tail), until it ended and everything
        its agents had has arrived (``follow=False``: what is there now)."""
        after: Dict[str, int] = {}
        partial: Dict[str, str] = {}
        quiet = 0
        while True:
            q = ",".join(f"{n}:{o}" for n, o in sorted(after.items()))
            v = await self._call(
                "GET", f"/v1/allocations/{_seg(alloc_id)}/logs/live", params={"stream": stream, "after": q}
            )
            got = False
            for node, o in sorted(v["nodes"].items()):
                data = partial.pop(node, "") + o.get("data", "")
                after[node] = o.get("next", after.get(node, 0))
                if not data:
                    continue
                got = True
                *lines, rest = data.split("\n")
                if rest:
                    partial[node] = rest
                for line in lines:
                    yield LogLine(node=node, stream=stream, message=line)
            if not follow:
                break
            quiet = 0 if got else quiet + 1
            if quiet >= 3 and (await self.status(alloc_id)).ended:
                break
            await asyncio.sleep(poll)
        for node, rest in sorted(partial.items()):
            yield LogLine(node=node, stream=stream, message=rest)

    # -- task launches -----------------------------------------------------------------------

    async def launch(
        self,
        alloc_id: str,
        entrypoint: str,
        ntasks: Optional[int] = None,
        tasks_per_node: Optional[int] = None,
        env: Optional[Dict[str, str]] = None,
    ) -> TaskLaunch:
        """Starts ranks in a running allocation (``lattice launch``)."""
        body: Dict[str, Any] = {"entrypoint": entrypoint}
        if ntasks is not None:
            body["ntasks"] = ntasks
        if tasks_per_node is not None:
            body["tasks_per_node"] = tasks_per_node
        if env:
            body["env"] = env
        return TaskLaunch.from_json(await self._call("POST", f"/v1/allocations/{_seg(alloc_id)}/tasks", json=body))

    async def task_launch(self, alloc_id: str, launch_id: str) -> TaskLaunch:
        v = await self._call("GET", f"/v1/allocations/{_seg(alloc_id)}/tasks/{_seg(launch_id)}")
        return TaskLaunch.from_json(v)

    # -- DAGs --------------------------------------------------------------------------------

    async def submit_dag(self, dag: Union[str, Dict[str, Any]]) -> Dag:
        """Submits a DAG: a dict (``{"allocations": [{"name", ..., "depends_on"}]}``) or the path of a
        YAML file holding one."""
        if isinstance(dag, str):
            import yaml

            with open(dag, encoding="utf-8") as f:
                dag = yaml.safe_load(f)
        return Dag.from_json(await self._call("POST", "/v1/dags", json=dag))

    async def dag(self, dag_id: str) -> Dag:
        return Dag.from_json(await self._call("GET", f"/v1/dags/{_seg(dag_id)}"))

    async def list_dags(
        self, tenant: Optional[str] = None, user: Optional[str] = None, state: Optional[str] = None
    ) -> List[Dag]:
        """DAGs, filtered by their members' tenant and user and by the DAG's overall state."""
        v = await self._call("GET", "/v1/dags", params={"tenant": tenant, "user": user, "state": state})
        return [Dag.from_json(d) for d in v["dags"]]

    async def cancel_dag(self, dag_id: str) -> int:
        """Cancels every allocation of the DAG: how many were cancelled."""
        return (await self._call("DELETE", f"/v1/dags/{_seg(dag_id)}"))["cancelled"]

    async def dag_graph(self, dag_id: str) -> Dict[str, Any]:
        """The DAG's structure: ``allocations`` (name, id, state) and ``edges`` (from, to, condition)."""
        return await self._call("GET", f"/v1/dags/{_seg(dag_id)}/graph")

    # -- sessions, services, observability ---------------------------------------------------

    async def create_session(self, tenant: str, **fields: Any) -> str:
        """An interactive session (an allocation whose work is a terminal; default 1 node, 4 h):
        its id. ``fields``: vcluster, resources, lifecycle, environment, tags."""
        body = {"tenant": tenant, **fields}
        return (await self._call("POST", "/v1/sessions", json=body))["session_id"]

    async def session(self, session_id: str) -> Allocation:
        return Allocation.from_json(await self._call("GET", f"/v1/sessions/{_seg(session_id)}"))

    async def end_session(self, session_id: str) -> str:
        return (await self._call("DELETE", f"/v1/sessions/{_seg(session_id)}"))["state"]

    async def services(self, tenant: Optional[str] = None) -> List[str]:
        """Registered service names (``tenant``: another tenant's, for those allowed to look)."""
        headers = {"x-lattice-tenant": tenant} if tenant else None
        return (await self._call("GET", "/api/v1/services", headers=headers))["services"]

    async def service(self, name: str, tenant: Optional[str] = None) -> List[Dict[str, Any]]:
        """A service's endpoints: allocation, tenant, node, host, port, protocol."""
        headers = {"x-lattice-tenant": tenant} if tenant else None
        return (await self._call("GET", f"/api/v1/services/{_seg(name)}", headers=headers))["endpoints"]

    async def metrics(self, alloc_id: str, mode: str = "summary", duration: Optional[str] = None,
                      metrics: Optional[List[str]] = None) -> Dict[str, Any]:
        """Its metrics from the TSDB (``mode``: summary, per-node, per-gpu)."""
        params = {"mode": mode, "duration": duration, "metrics": ",".join(metrics) if metrics else None}
        return await self._call("GET", f"/v1/allocations/{_seg(alloc_id)}/metrics", params=params)

    async def compare(self, ids: List[str], metrics: Optional[List[str]] = None, align: str = "relative",
                      step: Optional[str] = None) -> Dict[str, Any]:
        """Allocations' metric series side by side, aligned to each start."""
        params = {"ids": ",".join(ids), "metrics": ",".join(metrics) if metrics else None, "align": align,
                  "step": step}
        return await self._call("GET", "/v1/compare", params=params)

    async def diagnostics(self, alloc_id: str, part: Optional[str] = None) -> Dict[str, Any]:
        """Network and storage diagnostics (``part``: network or storage)."""
        tail = f"/{part}" if part else ""
        return await self._call("GET", f"/v1/allocations/{_seg(alloc_id)}/diagnostics{tail}")

    async def accounting(self, **params: Any) -> Dict[str, Any]:
        """Usage records (``tenant``, ``user``, ``days`` or ``since``/``until``): ``records`` and ``total``."""
        return await self._call("GET", "/v1/accounting", params=params)

    # -- nodes, tenants, vClusters, usage ----------------------------------------------------

    async def list_nodes(
        self, state: Optional[str] = None, vcluster: Optional[str] = None, tenant: Optional[str] = None
    ) -> List[Node]:
        """Nodes, filtered by state and by the vCluster or tenant of the allocation on them."""
        v = await self._call("GET", "/v1/nodes", params={"state": state, "vcluster": vcluster, "tenant": tenant})
        return [Node.from_json(n) for n in v["nodes"]]

    async def audit(
        self,
        user: Optional[str] = None,
        allocation: Optional[str] = None,
        node: Optional[str] = None,
        since: Optional[str] = None,
        until: Optional[str] = None,
        event: Optional[str] = None,
        data_path: Optional[str] = None,
        tenant: Optional[str] = None,
    ) -> Dict[str, Any]:
        """The audit log's entries the filters select (``entries``) and whether its hash chain holds
        (``chain_valid``). ``event``: types, comma-separated; ``data_path``: entries of allocations
        whose data is under that path."""
        params = {
            "user": user,
            "allocation": allocation,
            "node": node,
            "since": since,
            "until": until,
            "event": event,
            "data_path": data_path,
            "tenant": tenant,
        }
        return await self._call("GET", "/v1/audit/logs", params=params)

    async def node(self, name: str) -> Node:
        return Node.from_json(await self._call("GET", f"/v1/nodes/{_seg(name)}"))

    async def drain(self, name: str, urgent: bool = False) -> Dict[str, Any]:
        """Drains a node; ``urgent``: the allocation on it is asked to checkpoint now (the answer's
        ``checkpointed`` and ``not_checkpointed``)."""
        params = {"urgent": "true"} if urgent else None
        return await self._call("POST", f"/v1/nodes/{_seg(name)}/drain", params=params)

    async def undrain(self, name: str) -> Dict[str, Any]:
        return await self._call("POST", f"/v1/nodes/{_seg(name)}/undrain")

    async def retry_wipe(self, node: str) -> Dict[str, Any]:
        """Retries a quarantined node's secure wipe (``lattice admin node wipe NODE --force``):
        ``node``, ``claim``, ``wiping``; a node that is not quarantined is a 409."""
        return await self._call("POST", f"/v1/nodes/{_seg(node)}/wipe", json={"force": True})

    async def list_tenants(self) -> List[Tenant]:
        return [Tenant(name=t) for t in (await self._call("GET", "/v1/tenants"))["tenants"]]

    async def tenant(self, name: str) -> Dict[str, Any]:
        """One tenant: its quotas, nodes held, running and pending allocations, 90-day usage."""
        return await self._call("GET", f"/v1/tenants/{_seg(name)}")

    async def create_tenant(self, name: str, quota: Dict[str, Any]) -> Dict[str, Any]:
        """Creates a tenant with its quotas (SystemAdmin; committed through the quorum)."""
        return await self._call("POST", "/api/v1/tenants", json={"name": name, **quota})

    async def update_tenant(self, name: str, quota: Dict[str, Any]) -> Dict[str, Any]:
        """Changes only the quota keys given (``None`` clears one); a ``warning`` when ``max_nodes``
        is below what the tenant holds."""
        return await self._call("PUT", f"/api/v1/tenants/{_seg(name)}", json=quota)

    async def delete_tenant(self, name: str) -> None:
        await self._call("DELETE", f"/api/v1/tenants/{_seg(name)}")

    async def projects(self, tenant: str) -> List[Dict[str, Any]]:
        """A tenant's projects: each one's quotas, nodes held, running and pending allocations."""
        return (await self._call("GET", f"/api/v1/tenants/{_seg(tenant)}/projects"))["projects"]

    async def create_project(self, tenant: str, name: str, quota: Dict[str, Any]) -> Dict[str, Any]:
        """A project's own hard quotas and soft budgets within its tenant (SystemAdmin)."""
        return await self._call("POST", f"/api/v1/tenants/{_seg(tenant)}/projects", json={"name": name, **quota})

    async def update_project(self, tenant: str, name: str, quota: Dict[str, Any]) -> Dict[str, Any]:
        return await self._call("PUT", f"/api/v1/tenants/{_seg(tenant)}/projects/{_seg(name)}", json=quota)

    async def delete_project(self, tenant: str, name: str) -> None:
        await self._call("DELETE", f"/api/v1/tenants/{_seg(tenant)}/projects/{_seg(name)}")

    async def list_vclusters(self) -> List[VCluster]:
        return [VCluster(name=v) for v in (await self._call("GET", "/v1/vclusters"))["vclusters"]]

    async def vcluster(self, name: str) -> Dict[str, Any]:
        """A vCluster's scheduler configuration and the weights in force (the keys
        :meth:`configure_vcluster` takes)."""
        return await self._call("GET", f"/v1/vclusters/{_seg(name)}")

    async def create_vcluster(self, name: str, **config: Any) -> Dict[str, Any]:
        """Creates a vCluster (SystemAdmin): ``policy``, ``cycle_interval`` ("15s"), ``weights``, ..."""
        return await self._call("POST", "/v1/vclusters", json={"name": name, **config})

    async def configure_vcluster(self, name: str, **config: Any) -> Dict[str, Any]:
        """Changes the configuration keys given (SystemAdmin); committed at the quorum."""
        return await self._call("PATCH", f"/v1/vclusters/{_seg(name)}", json=config)

    async def set_weights(self, name: str, weights: Dict[str, float]) -> Dict[str, Any]:
        """Replaces a vCluster's nine cost weights (missing ones 0; SystemAdmin)."""
        return await self._call("PUT", f"/v1/vclusters/{_seg(name)}/weights", json=weights)

    async def queue(self, vcluster: str) -> List[Dict[str, Any]]:
        return (await self._call("GET", f"/v1/vclusters/{_seg(vcluster)}/queue"))["queue"]

    async def tenant_usage(self, tenant: str, **params: Any) -> Dict[str, Any]:
        return await self._call("GET", f"/api/v1/tenants/{_seg(tenant)}/usage", params=params)

    async def usage(self, **params: Any) -> Dict[str, Any]:
        return await self._call("GET", "/api/v1/usage", params=params)

    async def health(self) -> Dict[str, Any]:
        return await self._call("GET", "/healthz")


def _tls(verify: Union[bool, str, ssl.SSLContext], cert: Optional[Any]) -> Union[bool, ssl.SSLContext]:
    """The TLS context for ``verify`` (a CA bundle path, True for the system's CAs, False for none) and
    ``cert`` (a client certificate: a PEM path holding the key too, or ``(cert, key)`` paths)."""
    if isinstance(verify, ssl.SSLContext):
        ctx = verify
    elif verify is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif isinstance(verify, str):
        ctx = ssl.create_default_context(cafile=verify)
    else:
        ctx = ssl.create_default_context()
    if cert is not None:
        if isinstance(cert, str):
            ctx.load_cert_chain(cert)
        else:
            ctx.load_cert_chain(*cert)
    return ctx


def _seg(s: str) -> str:
    """``s`` as one URL path segment (an element id ``a-000001[3]`` included)."""
    return quote(s, safe="")


def members(base_url: Union[str, Sequence[str]]) -> List[str]:
    """A member list: URLs, or one string of comma-separated URLs (``LATTICE_ENDPOINT``)."""
    items = base_url.split(",") if isinstance(base_url, str) else list(base_url)
    urls = [u.strip().rstrip("/") for u in items if u.strip()]
    if not urls:
        raise ValueError("no Lattice endpoint given")
    return urls


def _leader_url(r: httpx.Response) -> Optional[str]:
    body = _body(r)
    url = body.get("leader_url") if isinstance(body, dict) else None
    return url.rstrip("/") if isinstance(url, str) and url else None


def _after(passed: List[str]) -> str:
    return f" (after {'; '.join(passed)})" if passed else ""


def _body(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text


def _retry_after(r: httpx.Response) -> float:
    try:
        return max(0.0, float(r.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0
