"""The SDK against a real runtime with real agents: every call, the models, errors carrying the API's
field, watch and live log streaming, DAGs, task groups, the sync wrapper, 429 retries, token auth."""

import asyncio
import os
import time

import httpx
import pytest

from lattice_sdk import (
    AllocationSpec,
    LatticeAuthError,
    LatticeError,
    LatticeClient,
    LatticeNotFoundError,
    LatticeRateLimitError,
    LatticeValidationError,
    SyncLatticeClient,
)

from conftest import token


def run(coro):
    return asyncio.run(coro)


def spec(entrypoint: str, **kw) -> AllocationSpec:
    kw.setdefault("tenant", "bio")
    kw.setdefault("walltime", "10m")
    return AllocationSpec(entrypoint=entrypoint, **kw)


def test_submit_watch_and_logs_of_a_real_job(runtime):
    async def main():
        async with LatticeClient(runtime.host, runtime.port) as c:
            r = await c.submit(spec("echo hello from $LATTICE_ALLOC_ID; echo oops >&2; sleep 1; echo bye", user="alice"))
            assert r.id.startswith("a-")
            states = []
            lines = []

            async def follow():
                async for line in c.stream_logs(r.id):
                    lines.append(line)

            follower = asyncio.create_task(follow())
            async for e in c.watch(r.id, poll=0.2):
                states.append(e.state)
                if e.allocation.ended:
                    final = e.allocation
            await asyncio.wait_for(follower, 30)
            assert states[-1] == "completed" and "running" in states, states
            assert final.end_reason == "success" and final.user == "alice" and len(final.nodes) == 1
            assert [l.message for l in lines] == [f"hello from {r.id}", "bye"], lines
            # History from the log store, each stream on its own.
            node = final.nodes[0]
            assert (await c.logs(r.id))[node] == f"hello from {r.id}\nbye\n"
            assert (await c.logs(r.id, stream="stderr"))[node] == "oops\n"
            done = await c.list_allocations(state="completed", tenant="bio")
            assert r.id in [a.id for a in done]
            assert all(a.state == "completed" for a in done)

    run(main())


def test_errors_carry_the_status_and_the_field(runtime):
    async def main():
        async with LatticeClient(base_url=runtime.url) as c:
            with pytest.raises(LatticeValidationError) as e:
                await c.submit(spec("true", walltime="soon"))
            assert e.value.status_code == 400 and e.value.field == "lifecycle.walltime", e.value
            with pytest.raises(LatticeValidationError) as e:
                await c.submit({"tenant": "bio", "resources": {"nodes": 1}, "entrypoint": "x", "colour": "red"})
            assert e.value.status_code == 400
            with pytest.raises(LatticeNotFoundError) as e:
                await c.status("a-999999")
            assert e.value.status_code == 404
            with pytest.raises(LatticeValidationError) as e:
                await c.logs("a-999999", stream="both")
            assert e.value.field == "stream"

    run(main())


def test_update_checkpoint_and_cancel(runtime):
    async def main():
        async with LatticeClient(base_url=runtime.url) as c:
            r = await c.submit(spec("trap 'echo hint' USR1; sleep 600 & wait; sleep 600", nodes=1))
            async for e in c.watch(r.id, poll=0.1):
                if e.state == "running":
                    break
            a = await c.update(r.id, walltime="2h", tags={"purpose": "sdk-test"})
            assert a.walltime_s == 7200 and a.tags["purpose"] == "sdk-test"
            assert await c.checkpoint(r.id) >= 1
            assert await c.cancel(r.id) == "cancelled"
            a = await c.wait(r.id, timeout=20)
            assert a.state == "cancelled" and a.ended

    run(main())


def test_task_groups_and_dags(runtime, tmp_path):
    async def main():
        async with LatticeClient(base_url=runtime.url) as c:
            g = await c.submit(spec("echo element ${INDEX}", task_group=(0, 2, 2)))
            assert len(g.elements) == 3
            for el in g.elements:
                a = await c.wait(el, timeout=30)
                assert a.end_reason == "success" and a.task_group["group"] == g.id
            path = tmp_path / "workflow.yaml"
            path.write_text(
                "allocations:\n"
                "  - {name: prep, tenant: bio, entrypoint: 'echo prep', resources: {nodes: 1}, lifecycle: {walltime: 5m}}\n"
                "  - name: train\n"
                "    tenant: bio\n"
                "    entrypoint: echo train\n"
                "    resources: {nodes: 1}\n"
                "    lifecycle: {walltime: 5m}\n"
                "    depends_on: [{ref: prep, condition: success}]\n"
            )
            d = await c.submit_dag(str(path))
            assert set(d.allocations) == {"prep", "train"}
            train = await c.wait(d.allocations["train"], timeout=30)
            prep = await c.status(d.allocations["prep"])
            assert train.end_reason == "success" and train.started_ms >= prep.ended_ms
            st = await c.dag(d.id)
            assert {m["name"]: m["state"] for m in st.allocations} == {"prep": "completed", "train": "completed"}
            assert d.id in [x.id for x in await c.list_dags()]

    run(main())


def test_sessions_services_graphs_accounting_and_observability(runtime):
    async def main():
        async with LatticeClient(base_url=runtime.url) as c:
            # A service: in the registry while it runs, with its node and port.
            r = await c.submit({"tenant": "bio", "entrypoint": "sleep 3", "resources": {"nodes": 1},
                                "lifecycle": {"walltime": "5m"},
                                "connectivity": {"expose": [{"name": "api", "port": 18080, "protocol": "http"}]}})
            for _ in range(100):
                if (await c.status(r.id)).state == "running":
                    break
                await asyncio.sleep(0.1)
            assert await c.services() == ["api"]
            [e] = await c.service("api")
            assert (e["allocation"], e["port"], e["protocol"]) == (r.id, 18080, "http")
            assert await c.services(tenant="physics") == []
            with pytest.raises(LatticeNotFoundError) as nf:
                await c.service("nope")
            assert nf.value.field == "name"
            # Diagnostics know its nodes; metrics need a TSDB this runtime does not have (503).
            d = await c.diagnostics(r.id)
            assert d["network"]["group_span"] == 1 and "TSDB" in d["note"]
            assert set(await c.diagnostics(r.id, "storage")) >= {"id", "storage"}
            with pytest.raises(LatticeError) as no_tsdb:
                await c.metrics(r.id)
            assert no_tsdb.value.status_code == 503
            await c.wait(r.id, timeout=30)
            assert await c.services() == []
            # A session: an allocation tagged as one; ending it cancels it.
            sid = await c.create_session("bio", lifecycle={"walltime": "1h"})
            s = await c.session(sid)
            assert s.tags.get("session") == "true" and s.walltime_s == 3600
            await c.end_session(sid)
            # A cancel that arrives while its start is at the quorum takes effect on the answer.
            assert (await c.wait(sid, timeout=30)).state == "cancelled"
            assert (await c.session(sid)).ended_ms is not None
            # A DAG's graph, usage records and a tenant's view.
            dag = await c.submit_dag({"allocations": [
                {"name": "a", "tenant": "bio", "entrypoint": "true", "resources": {"nodes": 1}, "lifecycle": {"walltime": "5m"}},
                {"name": "b", "tenant": "bio", "entrypoint": "true", "resources": {"nodes": 1}, "lifecycle": {"walltime": "5m"},
                 "depends_on": [{"ref": "a", "condition": "any"}]}]})
            g = await c.dag_graph(dag.id)
            assert g["edges"] == [{"from": "a", "to": "b", "condition": "any"}]
            acct = await c.accounting(tenant="bio", days=1)
            assert len(acct["records"]) == acct["total"]["allocations"] >= 1
            assert (await c.tenant("bio"))["name"] == "bio"

    run(main())


def test_nodes_tenants_vclusters_and_launches(runtime):
    async def main():
        async with LatticeClient(base_url=runtime.url) as c:
            nodes = await c.list_nodes()
            assert sorted(n.name for n in nodes) == ["sim-000", "sim-001"]
            # The agents registered: their capabilities are on the node.
            t0 = time.time()
            while any(n.fingerprint is None for n in nodes):
                assert time.time() - t0 < 10
                await asyncio.sleep(0.2)
                nodes = await c.list_nodes()
            for n in await c.list_nodes(state="ready"):
                assert n.state == "ready"
            assert "physics" in [t.name for t in await c.list_tenants()]
            assert "default" in [v.name for v in await c.list_vclusters()]
            assert (await c.health())["raft_state"] == "Leader"
            # A task launch in a running allocation: two ranks, their output.
            r = await c.submit(spec("sleep 30", nodes=1))
            async for e in c.watch(r.id, poll=0.1):
                if e.state == "running":
                    break
            launch = await c.launch(r.id, "echo rank $LATTICE_RANK of $LATTICE_NPROCS", ntasks=2)
            t0 = time.time()
            while True:
                t = await c.task_launch(r.id, launch.launch_id)
                if t.state in ("completed", "failed"):
                    break
                assert time.time() - t0 < 20, t
                await asyncio.sleep(0.2)
            assert t.state == "completed", t
            assert sorted(o["stdout"] for o in t.output) == ["rank 0 of 2\n", "rank 1 of 2\n"]
            await c.cancel(r.id)

    run(main())


def test_tenant_and_project_administration(runtime):
    async def main():
        async with LatticeClient(base_url=runtime.url) as c:
            t = await c.create_tenant("chem", {"max_nodes": 2, "gpu_hours_budget": 100.0})
            assert t["quota"]["max_nodes"] == 2
            t = await c.update_tenant("chem", {"max_nodes": 3, "gpu_hours_budget": None})
            assert t["quota"]["max_nodes"] == 3 and t["quota"]["gpu_hours_budget"] is None
            p = await c.create_project("chem", "qcd", {"max_nodes": 1})
            assert (p["tenant"], p["name"], p["quota"]["max_nodes"]) == ("chem", "qcd", 1)
            with pytest.raises(LatticeValidationError) as e:
                await c.create_project("chem", "astro", {"fair_share_target": 0.1})
            assert e.value.field == "fair_share_target"
            p = await c.update_project("chem", "qcd", {"max_concurrent_allocations": 4})
            assert (p["quota"]["max_nodes"], p["quota"]["max_concurrent_allocations"]) == (1, 4)
            assert [x["name"] for x in await c.projects("chem")] == ["qcd"]
            await c.delete_project("chem", "qcd")
            with pytest.raises(LatticeNotFoundError):
                await c.update_project("chem", "qcd", {"max_nodes": 2})
            await c.delete_tenant("chem")
            assert "chem" not in [x.name for x in await c.list_tenants()]
            # A wipe retry of a node that is not quarantined is refused.
            with pytest.raises(LatticeError) as e:
                await c.retry_wipe("sim-000")
            assert e.value.status_code == 409

    run(main())


def test_the_sync_client(runtime):
    with SyncLatticeClient(base_url=runtime.url) as c:
        r = c.submit(spec("echo sync"))
        states = [e.state for e in c.watch(r.id, poll=0.2)]
        assert states[-1] == "completed"
        a = c.status(r.id)
        assert a.end_reason == "success"
        assert c.logs(r.id)[a.nodes[0]] == "sync\n"


def test_vcluster_configuration(runtime):
    async def main():
        async with LatticeClient(base_url=runtime.url) as c:
            v = await c.create_vcluster("sdk-batch", policy="fcfs", cycle_interval="2s")
            assert (v["policy"], v["cycle_interval"]) == ("fcfs", 2.0)
            v = await c.configure_vcluster("sdk-batch", reference_wait="2h")
            assert (v["reference_wait"], v["cycle_interval"]) == (7200.0, 2.0)
            await c.set_weights("sdk-batch", {"priority": 0.6, "wait_time": 0.4})
            assert (await c.vcluster("sdk-batch"))["weights"]["priority"] == 0.6
            with pytest.raises(LatticeValidationError) as e:
                await c.configure_vcluster("sdk-batch", lend_cap=2)
            assert e.value.field == "lend_cap"
            assert (await c.vcluster("sdk-batch"))["lend_cap"] == 0.5

    run(main())


def test_members_that_are_down_or_not_the_leader_are_passed_over(runtime):
    """A quorum's members: a dead one and one answering 421 are passed over (the write sent once to
    the member that took it); a member that never answers is passed over by reads only."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.host))
        if request.url.host == "dead":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.host == "silent":
            raise httpx.ReadTimeout("no answer", request=request)
        if request.url.host == "follower":
            return httpx.Response(421, json={"error": "not the quorum leader", "leader_id": 1})
        if request.url.host == "pointer":
            return httpx.Response(421, json={"error": "not the quorum leader", "leader_url": "http://leader/"})
        return httpx.Response(201, json={"id": "a-000007"})

    async def main():
        mock = httpx.MockTransport(handler)
        async with LatticeClient(base_url="http://dead,http://follower,http://leader", transport=mock) as c:
            assert c.base_urls == ["http://dead", "http://follower", "http://leader"]
            r = await c.submit({"tenant": "bio", "entrypoint": "true"})
            assert r.id == "a-000007"
            assert seen == [("POST", "dead"), ("POST", "follower"), ("POST", "leader")]
            # The next request starts from the member that answered.
            seen.clear()
            await c.submit({"tenant": "bio", "entrypoint": "true"})
            assert seen == [("POST", "leader")]
        seen.clear()
        async with LatticeClient(base_url=["http://silent", "http://leader"], transport=mock) as c:
            with pytest.raises(LatticeError):
                await c.submit({"tenant": "bio", "entrypoint": "true"})
            assert seen == [("POST", "silent")], "a write that may have been received is not sent again"
            seen.clear()
            await c._call("GET", "/v1/allocations/a-000007")
            assert seen == [("GET", "silent"), ("GET", "leader")]
        # A member that is not the leader names it: it is tried next, and first from then on.
        seen.clear()
        async with LatticeClient(base_url="http://dead,http://pointer", transport=mock) as c:
            r = await c.submit({"tenant": "bio", "entrypoint": "true"})
            assert seen == [("POST", "dead"), ("POST", "pointer"), ("POST", "leader")]
            seen.clear()
            await c.submit({"tenant": "bio", "entrypoint": "true"})
            assert seen == [("POST", "leader")]
        # A real member after a dead one.
        async with LatticeClient(base_url=f"http://127.0.0.1:1,{runtime.url}") as c:
            assert "default" in [v.name for v in await c.list_vclusters()]

    run(main())


def test_a_429_is_retried_after_retry_after_then_raised():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if len(calls) <= 2:
            return httpx.Response(429, headers={"Retry-After": "0.2"}, json={"error": "rate limit exceeded"})
        return httpx.Response(200, json={"id": "a-000001", "state": "running"})

    async def main():
        async with LatticeClient(base_url="http://test", transport=httpx.MockTransport(handler)) as c:
            a = await c.status("a-000001")
            assert a.state == "running" and len(calls) == 3
            assert calls[1] - calls[0] >= 0.19 and calls[2] - calls[1] >= 0.19
        calls.clear()
        always = httpx.MockTransport(
            lambda r: httpx.Response(429, headers={"Retry-After": "7"}, json={"error": "rate limit exceeded"})
        )
        async with LatticeClient(base_url="http://test", transport=always, retries=0) as c:
            with pytest.raises(LatticeRateLimitError) as e:
                await c.status("a-000001")
            assert e.value.retry_after == 7 and e.value.status_code == 429

    run(main())


def test_tokens(secured_runtime):
    async def main():
        async with LatticeClient(base_url=secured_runtime.url) as c:
            with pytest.raises(LatticeAuthError) as e:
                await c.list_allocations()
            assert e.value.status_code == 401
        async with LatticeClient(base_url=secured_runtime.url, token=token("alice")) as c:
            r = await c.submit(spec("true", tenant="physics"))
            a = await c.status(r.id)
            assert a.tenant == "physics" and a.user == "alice"
        async with LatticeClient(base_url=secured_runtime.url, token="not-a-jwt") as c:
            with pytest.raises(LatticeAuthError):
                await c.status(r.id)
        # `mine`: only the caller's own; several states at once; a usage window by dates.
        async with LatticeClient(base_url=secured_runtime.url, token=token("bob")) as c:
            b = await c.submit(spec("true", tenant="physics"))
            mine = await c.list_allocations(mine=True, state="pending,running,completed,failed")
            assert [a.id for a in mine] == [b.id], mine
            u = await c.usage(since="2026-01-01")
            assert "node_hours" in u, u
            with pytest.raises(LatticeValidationError) as e:
                await c.usage(since="2030-01-02", until="2030-01-01")
            assert e.value.field == "since"

    run(main())


@pytest.mark.parametrize("example", ["quickstart.py", "workflow.py"])
def test_the_examples_run(runtime, example):
    import subprocess
    import sys

    here = os.path.join(os.path.dirname(__file__), "..", "examples", example)
    env = dict(os.environ, LATTICE_TENANT="bio")
    out = subprocess.run([sys.executable, here, runtime.url], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    if example == "quickstart.py":
        assert "State: completed (success)" in out.stdout and "stderr of sim-0" in out.stdout, out.stdout
        assert "] hello from sim-0" in out.stdout, out.stdout
    else:
        assert "train: completed (success)" in out.stdout and out.stdout.count(": completed, output 'point") == 4, out.stdout


def test_the_models_match_the_openapi_document(runtime):
    """The SDK's models against the server's own document: the answer models hold exactly the
    properties the API documents, and a fully populated spec sends only fields the API accepts."""
    import dataclasses

    import httpx as h

    from lattice_sdk import Allocation, DataMount, Node, TaskLaunch

    doc = h.get(runtime.url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]

    def props(name):
        return set(schemas[name]["properties"])

    def fields(cls):
        return {f.name for f in dataclasses.fields(cls)} - {"extra"}

    assert fields(Allocation) == props("AllocationView")
    assert fields(Node) == props("NodeView")
    assert fields(TaskLaunch) <= props("LaunchView")
    full = AllocationSpec(
        entrypoint="x",
        tenant="t",
        project="p",
        user="u",
        vcluster="v",
        uenv="a/b:c",
        view="default",
        tools_uenv="profiling/2024.1",
        constraints={"gpu_type": "GH200", "gpu_count": 4, "features": ["nvme_scratch"]},
        preemption_class=3,
        tags={"k": "v"},
        depends_on={"a-1": "success"},
        task_group=(0, 9, 2),
        data_mounts=[DataMount("s3://d/x", "/in", True, "hot", 1.0)],
        data_defaults=False,
        checkpoint={"strategy": "auto"},
        min_nodes=1,
        sensitive=True,
        network_domain="n",
        expose=[{"name": "api", "port": 8080, "protocol": "http"}],
        liveness_probe={"probe_type": "http", "port": 8080, "path": "/healthz"},
        idempotency_key="k",
        duration="1s",
    ).to_json()
    assert set(full) <= props("SubmitRequest"), set(full) - props("SubmitRequest")
    assert set(full["lifecycle"]) <= props("LifecycleIn")
    assert set(full["environment"]) <= props("EnvironmentIn"), full["environment"]
    assert set(full["resources"]) <= props("Resources")
    assert set(full["resources"]["constraints"]) <= props("ConstraintsIn")
    assert set(full["data"]) <= props("DataIn")
    assert set(full["data"]["mounts"][0]) <= props("MountIn")
    assert set(full["task_group"]) <= props("TaskGroupIn")
    assert set(full["depends_on"][0]) <= props("DependsIn")
    assert set(full["connectivity"]) <= props("ConnectivityIn")
    assert set(full["connectivity"]["expose"][0]) <= props("ExposeIn")
    assert set(full["liveness_probe"]) <= props("LivenessProbeIn")
    # And the routes the client calls are documented.
    for path in ["/v1/allocations", "/v1/allocations/{id}", "/v1/allocations/{id}/logs", "/v1/allocations/{id}/logs/live",
                 "/v1/allocations/{id}/tasks", "/v1/dags", "/v1/dags/{id}", "/v1/nodes", "/v1/tenants", "/v1/vclusters",
                 "/v1/dags/{id}/graph", "/v1/sessions", "/v1/sessions/{id}", "/api/v1/services", "/api/v1/services/{name}",
                 "/v1/allocations/{id}/metrics", "/v1/compare", "/v1/allocations/{id}/diagnostics", "/v1/accounting",
                 "/v1/tenants/{id}"]:
        assert path in doc["paths"], path


def test_tls_and_client_certificates(mtls_runtime):
    from conftest import tls_file

    from lattice_sdk import LatticeError

    async def main():
        ca = tls_file("ca.pem")
        cert = (tls_file("client.pem"), tls_file("client.key"))
        async with LatticeClient(base_url=mtls_runtime.url, verify=ca, cert=cert) as c:
            r = await c.submit(spec("true"))
            assert (await c.status(r.id)).id == r.id
        # No client certificate: the member refuses the connection.
        async with LatticeClient(base_url=mtls_runtime.url, verify=ca) as c:
            with pytest.raises(LatticeError) as e:
                await c.list_allocations()
            assert e.value.status_code is None
        # A server the client does not trust (the system's CAs only).
        async with LatticeClient(base_url=mtls_runtime.url, cert=cert) as c:
            with pytest.raises(LatticeError):
                await c.list_allocations()

    run(main())


def test_every_trace_field_can_be_submitted(runtime):
    """Every field of the trace format's submit event (``traces/jsonl-schema.json``) can be asked for
    through ``AllocationSpec`` (derived from the schema: a new trace field fails here until the SDK
    has it), and the runtime takes the request and shows what was asked."""
    import json
    import pathlib

    schema = json.loads((pathlib.Path(__file__).parents[3] / "traces" / "jsonl-schema.json").read_text())

    def paths(node, prefix=""):
        for k, v in node.get("properties", {}).items():
            p = f"{prefix}.{k}" if prefix else k
            yield p
            if "scale_policy" not in p and "range" not in p:
                yield from paths(v, p)

    moved = {
        "nodes": "resources.nodes",
        "gpu_type": "resources.constraints.gpu_type",
        "constraints": "resources.constraints",
        "walltime": "lifecycle.walltime",
        "priority": "preemption_class",
    }

    def in_api(p):
        for src, dst in moved.items():
            if p == src or p.startswith(src + "."):
                return dst + p[len(src):]
        return p

    wanted = {in_api(p) for p in paths(schema["$defs"]["alloc"])} - {"id"}
    from lattice_sdk import DataMount

    full = spec(
        "true",
        nodes=2,
        project="p",
        user="alice",
        vcluster="default",
        constraints={"gpu_count": 0, "features": [], "topology": "any", "cpu_cores": 1, "memory_gb": 1},
        preemption_class=3,
        checkpoint={"strategy": "auto", "estimated_minutes": 2, "mechanism": "signal"},
        depends_on={"a-999999": "any"},
        duration="1s",
        storage_gbps=0.5,
        requeue="always",
        max_requeues=2,
        task_group=(0, 1, 1),
        mutex="m",
        data_mounts=[DataMount(source="s3://b/d", target="/data")],
        data_defaults=False,
    )
    body = full.to_json()
    reactive = spec(
        "true",
        lifecycle="reactive",
        min_nodes=1,
        max_nodes=2,
        metric="queue_depth",
        target=5,
        scale_policy={"cooldown": "5m"},
    ).to_json()
    body["resources"]["constraints"]["gpu_type"] = "H200"
    body["resources"]["constraints"]["require_unified_memory"] = True

    def have(v, prefix=""):
        for k, x in v.items():
            p = f"{prefix}.{k}" if prefix else k
            yield p
            if isinstance(x, dict):
                yield from have(x, p)

    got = set(have(body)) | set(have(reactive))
    assert wanted <= got, sorted(wanted - got)
    # The runtime takes them and shows what was asked (without what would reach the real agents'
    # storage, other tenants' names or a dependency that is not there).
    r = httpx.post(runtime.url + "/v1/allocations", json=reactive)
    assert r.status_code == 201, r.text
    for k in ("depends_on", "data", "task_group", "project", "vcluster", "user"):
        del body[k]
    body["resources"] = {"nodes": 1, "constraints": {"topology": "any"}}
    r = httpx.post(runtime.url + "/v1/allocations", json=body)
    assert r.status_code == 201, r.text
    with SyncLatticeClient(base_url=runtime.url) as c:
        shown = c.status(r.json()["id"])
    assert (shown.requeue, shown.max_requeues, shown.mutex, shown.storage_gbps) == ("always", 2, "m", 0.5)
