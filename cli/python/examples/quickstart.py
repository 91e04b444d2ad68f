"""Submit a job, follow its state and output, then read its stderr: `python quickstart.py [URL]`."""

import asyncio
import os
import sys

from lattice_sdk import AllocationSpec, LatticeClient


async def main(url: str) -> None:
    async with LatticeClient(base_url=url, token=os.environ.get("LATTICE_TOKEN")) as client:
        alloc = await client.submit(
            AllocationSpec(
                entrypoint="echo hello from $LATTICE_NODELIST; echo a warning >&2; sleep 2",
                nodes=1,
                walltime="10m",
                tenant=os.environ.get("LATTICE_TENANT", "physics"),
            )
        )
        print(f"Submitted: {alloc.id}")
        async for line in client.stream_logs(alloc.id):
            print(f"[{line.node}] {line.message}")
        final = await client.wait(alloc.id)
        print(f"State: {final.state} ({final.end_reason})")
        for node, text in (await client.logs(alloc.id, stream="stderr")).items():
            print(f"stderr of {node}: {text.strip()}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"))
