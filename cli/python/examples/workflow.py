"""A DAG (prepare → train) and a task group, with the synchronous client: `python workflow.py [URL]`."""

import os
import sys

from lattice_sdk import AllocationSpec, SyncLatticeClient


def main(url: str) -> None:
    tenant = os.environ.get("LATTICE_TENANT", "physics")
    with SyncLatticeClient(base_url=url, token=os.environ.get("LATTICE_TOKEN")) as client:
        member = lambda name, cmd, **kw: {  # noqa: E731
            "name": name,
            "tenant": tenant,
            "entrypoint": cmd,
            "resources": {"nodes": 1},
            "lifecycle": {"walltime": "10m"},
            **kw,
        }
        dag = client.submit_dag(
            {
                "allocations": [
                    member("prepare", "echo preparing"),
                    member("train", "echo training", depends_on=[{"ref": "prepare", "condition": "success"}]),
                ]
            }
        )
        print(f"DAG {dag.id}: {dag.allocations}")
        train = client.wait(dag.allocations["train"])
        print(f"train: {train.state} ({train.end_reason})")
        sweep = client.submit(AllocationSpec(entrypoint="echo point ${INDEX}", tenant=tenant, task_group=(0, 3, 2)))
        for element in sweep.elements:
            a = client.wait(element)
            print(f"{element}: {a.state}, output {client.logs(element).get(a.nodes[0], '').strip()!r}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080")
