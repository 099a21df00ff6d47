"""redis-servers the factory tests need beyond ``tests/redis_servers.py``: one on a unix socket
and one speaking TLS only (a throwaway self-signed certificate made with ``openssl``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.ports import free_port
from tests.redis_servers import REDIS_SERVER, ping_until_up

__all__ = ["Server", "SocketRedis", "TlsRedis"]


class Server:
    """A redis-server with ``args``; ``ping`` is how it is known to be up."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        raise NotImplementedError

    def ping_args(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> Server:
        base = [REDIS_SERVER, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.dir)]
        self.proc = subprocess.Popen([*base, *self.args()], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        if ping_until_up(self.ping_args()):
            return self
        self.stop()
        raise RuntimeError(f"{type(self).__name__} did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class SocketRedis(Server):
    """Listens on ``<dir>/redis.sock`` only."""

    @property
    def path(self) -> Path:
        return self.dir / "redis.sock"

    def args(self) -> list[str]:
        return ["--port", "0", "--unixsocket", str(self.path), "--unixsocketperm", "700"]

    def ping_args(self) -> list[str]:
        return ["-s", str(self.path)]


class TlsRedis(Server):
    """Speaks TLS only, on a free port, with a certificate for 127.0.0.1 (``ca`` trusts it)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.port = free_port()
        self.ca = directory / "cert.pem"
        self.key = directory / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", str(self.key), "-out", str(self.ca), "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True, timeout=60)

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}?ssl_ca_certs={self.ca}"

    def args(self) -> list[str]:
        return ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.ca),
                "--tls-key-file", str(self.key), "--tls-ca-cert-file", str(self.ca),
                "--tls-auth-clients", "no"]

    def ping_args(self) -> list[str]:
        return ["--tls", "--cacert", str(self.ca), "-p", str(self.port)]
