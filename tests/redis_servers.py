"""Throwaway redis-server processes on free loopback ports: single nodes and a 3-master cluster.

Never the system Redis on 6379. ``durable=True`` turns on the AOF with ``appendfsync always``
for tests that SIGKILL Redis and then check nothing it acknowledged is gone (that is Redis's
half of the promise; the ledger's half is what these tests are about).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from tests.ports import free_port, free_ports

__all__ = ["RedisCluster3", "RedisProc", "ping_until_up"]

REDIS_SERVER = "/usr/bin/redis-server"
REDIS_CLI = "/usr/bin/redis-cli"
CLUSTER_BUS_OFFSET = 10000  # a cluster node's bus port is its client port + 10000


def ping_until_up(cli_args: list[str], timeout: float = 10.0) -> bool:
    """Asks ``redis-cli <cli_args> PING`` until the answer is PONG (True) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run([REDIS_CLI, *cli_args, "PING"], capture_output=True, text=True,
                             timeout=5)
        if out.stdout.strip() == "PONG":
            return True
        time.sleep(0.02)
    return False


class RedisProc:
    """One redis-server; ``kill`` is SIGKILL, ``start`` again reuses the port and directory."""

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        cluster: bool = False,
        durable: bool = False,
    ) -> None:
        self.dir = directory
        self.cluster = cluster
        self.durable = durable
        self.port = port or free_port(bus_offset=CLUSTER_BUS_OFFSET if cluster else None)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> RedisProc:
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--dir", str(self.dir)]
        if self.durable:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
            args += ["--appendfilename", f"aof-{self.port}.aof"]
        else:
            args += ["--appendonly", "no"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{self.port}.conf"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        if not ping_until_up(["-p", str(self.port)], timeout):
            raise RuntimeError(f"redis-server on {self.port} did not start")

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            [REDIS_CLI, "-p", str(self.port), *args], capture_output=True, text=True, timeout=5
        )
        return out.stdout

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no goodbye to clients."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test froze it
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        self.kill()


class RedisCluster3:
    """Three masters, no replicas, every slot covered."""

    def __init__(self, directory: Path) -> None:
        ports = free_ports(3, bus_offset=CLUSTER_BUS_OFFSET)
        self.nodes = [RedisProc(directory, port=port, cluster=True) for port in ports]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisCluster3:
        for node in self.nodes:
            node.start()
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            check=True,
            timeout=30,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in self.nodes):
                return self
            time.sleep(0.1)
        raise RuntimeError("cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
