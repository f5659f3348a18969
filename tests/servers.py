"""Real servers for tests, started on loopback and stopped afterwards:
nginx (HTTP and HTTPS with a throwaway CA) and a fault-injecting TCP proxy."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def _stop(proc: Optional[subprocess.Popen]) -> None:
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def make_ca(workdir: Path) -> dict:
    """A CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    workdir.mkdir(parents=True, exist_ok=True)

    def run(*args):
        subprocess.run(["openssl", *args], cwd=workdir, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=tensorizer test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    (workdir / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    return {"ca": workdir / "ca.pem", "cert": workdir / "server.pem", "key": workdir / "server.key"}


class Nginx:
    """nginx serving `root` on an HTTP port and, with `tls`, an HTTPS port."""

    def __init__(self, root: Path, workdir: Path, tls: Optional[dict] = None):
        self.root, self.workdir, self.tls = root, workdir, tls
        self.port = free_port()
        self.tls_port = free_port() if tls else None
        self.proc: Optional[subprocess.Popen] = None

    def __enter__(self) -> "Nginx":
        w = self.workdir
        (w / "logs").mkdir(parents=True, exist_ok=True)
        tls_server = ""
        if self.tls:
            tls_server = f"""
    server {{
        listen 127.0.0.1:{self.tls_port} ssl;
        ssl_certificate {self.tls['cert']};
        ssl_certificate_key {self.tls['key']};
        root {self.root};
    }}"""
        # Started as root, nginx's workers would drop to "nobody" and could not
        # read pytest's private temporary folders.
        user = "user root root;" if os.geteuid() == 0 else ""
        (w / "nginx.conf").write_text(f"""
{user}
daemon off;
worker_processes 2;
pid {w}/nginx.pid;
error_log {w}/logs/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {w}/body;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    sendfile on;
    keepalive_requests 100000;
    types {{ }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{self.port};
        root {self.root};
        location /redirect/ {{ rewrite ^/redirect/(.*)$ /$1 redirect; }}
    }}{tls_server}
}}
""")
        self.proc = subprocess.Popen(
            [NGINX, "-p", str(w), "-c", str(w / "nginx.conf"), "-e", str(w / "logs" / "error.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            _wait_port(self.port)
            if self.tls_port:
                _wait_port(self.tls_port)
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def url(self, name: str, tls: bool = False) -> str:
        if tls:
            return f"https://127.0.0.1:{self.tls_port}/{name}"
        return f"http://127.0.0.1:{self.port}/{name}"

    def __exit__(self, *exc) -> None:
        _stop(self.proc)


class FaultProxy:
    """A TCP proxy to `upstream_port` that misbehaves on purpose.

    Per accepted connection it consults `plan` (a list consumed in order;
    once empty, connections are proxied faithfully):
      ("cut", n)     forward n response bytes, then reset the connection;
      ("stall", s)   forward the request, then send nothing for s seconds;
      ("stall_after", n, s)  forward n response bytes, then send nothing
                     for s seconds (the connection stays open) and close;
      ("status", c)  answer with HTTP status c and close, without contacting nginx.
    """

    def __init__(self, upstream_port: int, plan=None):
        self.upstream_port = upstream_port
        self.plan = list(plan or [])
        self.port = free_port()
        self.connections = 0
        self.response_bytes = 0  # forwarded to clients, headers included
        self.requests = 0  # HTTP requests seen (curl sends each in one piece)
        self.request_data = bytearray()  # everything clients sent
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", self.port))
        self._sock.listen(64)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def __enter__(self) -> "FaultProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        with contextlib.suppress(OSError):
            self._sock.close()
        self._thread.join(5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                action = self.plan.pop(0) if self.plan else None
            threading.Thread(target=self._serve, args=(client, action), daemon=True).start()

    def _serve(self, client: socket.socket, action) -> None:
        with contextlib.closing(client):
            if action and action[0] == "status":
                with contextlib.suppress(OSError):
                    client.recv(65536)
                    reason = {500: "Internal Server Error", 503: "Service Unavailable", 404: "Not Found",
                              403: "Forbidden", 429: "Too Many Requests"}.get(action[1], "Error")
                    client.sendall(f"HTTP/1.1 {action[1]} {reason}\r\nContent-Length: 0\r\n"
                                   "Connection: close\r\n\r\n".encode())
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                return
            with contextlib.closing(upstream):
                t = threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True)
                t.start()
                if action and action[0] == "stall":
                    time.sleep(action[1])
                    return
                limit = action[1] if action and action[0] in ("cut", "stall_after") else None
                self._pump(upstream, client, limit)
                if action and action[0] == "stall_after":
                    self._stop.wait(action[2])
                if limit is not None:
                    # Drop the connection now: shutdown() also wakes the thread
                    # blocked reading the client, which close() alone would not.
                    with contextlib.suppress(OSError):
                        client.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        upstream.shutdown(socket.SHUT_RDWR)

    def _count(self, dst: socket.socket, data: bytes) -> None:
        with self._lock:
            if dst.getsockname()[1] == self.port:  # towards the client
                self.response_bytes += len(data)
            else:
                self.requests += data.count(b"GET ")
                self.request_data += data

    def _pump(self, src: socket.socket, dst: socket.socket, limit: Optional[int]) -> None:
        sent = 0
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                data = src.recv(65536)
                if not data:
                    break
                # Counted before forwarding: once the client has the bytes
                # (and may be done), the counts already include them.
                if limit is not None and sent + len(data) >= limit:
                    self._count(dst, data[: limit - sent])
                    dst.sendall(data[: limit - sent])
                    return
                self._count(dst, data)
                dst.sendall(data)
                sent += len(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class RedisServer:
    """redis-server on a free loopback port, no persistence; `password` turns on AUTH."""

    def __init__(self, workdir: Path, password: Optional[str] = None):
        self.workdir = workdir
        self.password = password
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None

    def __enter__(self) -> "RedisServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(self.port),
                "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_port(self.port)
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def client(self, db: int = 0):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, db=db, password=self.password)

    def uri(self, prefix: str, db: int = 0, password: Optional[str] = None) -> str:
        auth = f":{password}@" if password else ""
        dbpart = f"{db}/" if db else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{dbpart}{prefix}"

    def __exit__(self, *exc) -> None:
        _stop(self.proc)


class MotoS3:
    """moto's S3 server (moto_server from the .venv) on a free loopback port."""

    def __init__(self, enforce_auth: bool = False):
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        # moto checks signatures against its IAM users once its first
        # (unauthenticated) actions are used up: see `make_user`.
        self.enforce_auth = enforce_auth

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def make_user(self) -> tuple:
        """With enforce_auth: an IAM user allowed everything; returns (key id, secret)."""
        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, aws_access_key_id="x",
                           aws_secret_access_key="x", region_name="us-east-1")
        iam.create_user(UserName="tz")
        iam.put_user_policy(UserName="tz", PolicyName="all", PolicyDocument=(
            '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}'))
        key = iam.create_access_key(UserName="tz")["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def __enter__(self) -> "MotoS3":
        import sys

        exe = Path(sys.executable).with_name("moto_server")
        env = dict(os.environ)
        if self.enforce_auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
        self.proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            _wait_port(self.port, timeout=30)
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def client(self, access_key: str = "testing", secret_key: str = "testing"):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=access_key,
                            aws_secret_access_key=secret_key, region_name="us-east-1")

    def __exit__(self, *exc) -> None:
        _stop(self.proc)
