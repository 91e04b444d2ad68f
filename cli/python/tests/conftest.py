"""Fixtures: a real ``lattice-runtime`` (single-member quorum) with two real ``lattice-agent`` processes
on loopback, started for the test session; and one with JWT authentication for the token tests."""

import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

BIN = os.environ.get("LATTICE_RUNTIME_BIN")


def _bin(name: str) -> str:
    if not BIN:
        pytest.fail("LATTICE_RUNTIME_BIN is not set: run cli/python/test.sh (it builds the runtime)")
    path = os.path.join(os.path.dirname(BIN), name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: build it with `cargo build -p {name}`")
    return path


class Runtime:
    def __init__(self, extra: str = "", nodes: int = 2, agents: bool = True, ssl_context=None):
        self.ssl_context = ssl_context
        self.dir = tempfile.mkdtemp(prefix="lattice-sdk-")
        with open(os.path.join(self.dir, "tenants.yaml"), "w") as f:
            f.write("physics:\n  max_nodes: 2\n")
        cfg = os.path.join(self.dir, "runtime.yaml")
        with open(cfg, "w") as f:
            f.write(
                "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\n"
                f"data_dir: {self.dir}/q\nsimulated_nodes: {nodes}\nsimulate_agents: false\ncycle: 100ms\n"
                f"tenants: {self.dir}/tenants.yaml\nlog_store: {self.dir}/logs\n" + extra
            )
        self.procs = []
        self.proc = subprocess.Popen(
            [_bin("lattice-runtime"), "--config", cfg, "--bootstrap"],
            stdout=subprocess.PIPE,
            stderr=open(os.path.join(self.dir, "runtime.log"), "w"),
            text=True,
        )
        self.procs.append(self.proc)
        # Its log goes to stdout too: the address is on the line saying where REST listens.
        seen = []
        m = None
        while m is None and len(seen) < 500:
            line = self.proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            m = re.search(r"REST on (http://[0-9.:]+)", line)
        if not m:
            self.stop()
            pytest.fail(f"lattice-runtime did not start: {''.join(seen)[-3000:]} {self.log()}")
        # Keep draining its stdout so it never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        self.url = m.group(1).replace("http://", "https://" if ssl_context else "http://")
        self.host, self.port = self.url.split("://", 1)[1].rsplit(":", 1)
        self.port = int(self.port)
        self._wait_leader()
        for i in range(nodes if agents else 0):
            node = f"sim-{i:03d}"
            self.procs.append(
                subprocess.Popen(
                    [
                        _bin("lattice-agent"),
                        "--node-id", node,
                        "--quorum-endpoint", self.url,
                        "--poll", "100ms",
                        "--heartbeat", "200ms",
                        "--log-dir", f"{self.dir}/agent-{node}/logs",
                        "--state-file", f"{self.dir}/agent-{node}/state.json",
                        "--scratch-dir", f"{self.dir}/agent-{node}/scratch",
                        "--log-store", f"{self.dir}/logs",
                        "--log-flush", "200ms",
                        "--peer-listen", "127.0.0.1:0",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=open(os.path.join(self.dir, f"agent-{node}.log"), "w"),
                )
            )

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "runtime.log")) as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def _wait_leader(self):
        t0 = time.time()
        while time.time() - t0 < 20:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2, context=self.ssl_context) as r:
                    if json.load(r).get("raft_state") == "Leader":
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        pytest.fail("lattice-runtime never led: " + self.log())

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


SECRET = "sdk-test-secret"


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def token(sub: str, roles=("User",), tenant="physics") -> str:
    """An HS256 JWT for the secured runtime (the runtime's development mode)."""
    claims = {"sub": sub, "roles": list(roles), "exp": int(time.time()) + 3600}
    if tenant:
        claims["tenant"] = tenant
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(claims).encode())
    sig = hmac.new(SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(sig)}"


@pytest.fixture(scope="session")
def runtime():
    r = Runtime()
    yield r
    r.stop()


@pytest.fixture(scope="session")
def secured_runtime():
    r = Runtime(extra=f"auth:\n  mode: jwt\n  hs256_secret: {SECRET}\n", nodes=1, agents=False)
    yield r
    r.stop()


TLS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "runtime", "tests", "fixtures", "tls")


def tls_file(name: str) -> str:
    return os.path.abspath(os.path.join(TLS, name))


@pytest.fixture(scope="session")
def mtls_runtime():
    import ssl

    ctx = ssl.create_default_context(cafile=tls_file("ca.pem"))
    ctx.load_cert_chain(tls_file("client.pem"), tls_file("client.key"))
    extra = (
        f"tls:\n  cert: {tls_file('member.pem')}\n  key: {tls_file('member.key')}\n"
        f"  ca: {tls_file('ca.pem')}\n  mtls: true\n"
    )
    r = Runtime(extra=extra, nodes=1, agents=False, ssl_context=ctx)
    yield r
    r.stop()
