"""What the S3 tests need besides a real S3 server: small HTTP servers on
127.0.0.1 that answer as a failing S3 server or an instance metadata
service would, and a network namespace with a way out whose transmitted
packets can be counted."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@contextlib.contextmanager
def answering(respond):
    """A server on 127.0.0.1 that answers every request with
    ``respond(method, path, headers) -> (status, content_type, body)``.
    Yields ``(endpoint, requests)``; ``requests`` lists ``(method, path)``
    as they came."""
    requests: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            requests.append((self.command, self.path))
            status, kind, body = respond(self.command, self.path, self.headers)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def s3_error(status: int, code: str, message: str):
    """A ``respond`` for ``answering``: every request fails with ``status``
    and an S3 error document."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>/</Resource><RequestId>1</RequestId></Error>"
    ).encode()
    return lambda method, path, headers: (status, "application/xml", body)


def instance_metadata(access_key: str, secret_key: str):
    """A ``respond`` for ``answering`` as EC2's instance metadata service
    (IMDSv2) answers: a session token, the role's name, its credentials."""
    role = "meshrun-role"

    def respond(method, path, headers):
        if method == "PUT" and path == "/latest/api/token":
            return 200, "text/plain", b"imds-session-token"
        if headers.get("X-aws-ec2-metadata-token") != "imds-session-token":
            return 401, "text/plain", b""
        if path == "/latest/meta-data/iam/security-credentials/":
            return 200, "text/plain", role.encode()
        if path == f"/latest/meta-data/iam/security-credentials/{role}":
            # No session token: SeaweedFS refuses keys that come with one
            # it did not issue itself.
            creds = {"Code": "Success", "AccessKeyId": access_key, "SecretAccessKey": secret_key, "Token": "", "Expiration": "2099-01-01T00:00:00Z"}
            return 200, "application/json", json.dumps(creds).encode()
        return 404, "text/plain", b""

    return respond


class NetnsWithAWayOut:
    """A network namespace of the test's own: ``lo`` up, and a veth pair
    ``out0``/``out1`` with the default route through ``out0``, so that a
    request to any address off loopback (169.254.169.254 among them) is
    really transmitted on ``out0``, and counted there, without leaving the
    namespace. IPv6 is off in it so that nothing else is ever sent.
    ``close()`` deletes it (by its unique name)."""

    def __init__(self) -> None:
        self.name = f"meshrun-s3-{os.getpid()}-{secrets.token_hex(4)}"
        self._ip("netns", "add", self.name)
        try:
            self.run(["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"], check=True)
            self._ip("-n", self.name, "link", "set", "lo", "up")
            self._ip("-n", self.name, "link", "add", "out0", "type", "veth", "peer", "name", "out1")
            self._ip("-n", self.name, "addr", "add", "10.253.0.2/24", "dev", "out0")
            self._ip("-n", self.name, "link", "set", "out0", "up")
            self._ip("-n", self.name, "link", "set", "out1", "up")
            self._ip("-n", self.name, "route", "add", "default", "dev", "out0")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """``argv`` run inside the namespace."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 180)
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], **kwargs)

    def sent(self) -> int:
        """Packets transmitted on ``out0`` so far."""
        shown = subprocess.run(["ip", "-n", self.name, "-j", "-s", "link", "show", "dev", "out0"], check=True, capture_output=True, text=True, timeout=30)
        return json.loads(shown.stdout)[0]["stats64"]["tx"]["packets"]

    def close(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, timeout=30)

    def __enter__(self) -> NetnsWithAWayOut:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def shell_without_aws(home: Path) -> dict[str, str]:
    """This process's environment without any AWS setting, nor meshrun's
    instance-metadata switch, with ``home`` (no ~/.aws) as HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "MESHRUN_S3_INSTANCE_METADATA"}
    env["HOME"] = str(home)
    return env


class HoldingProxy:
    """A TCP proxy on 127.0.0.1 in front of a real S3 server: every request
    passes through as it came, except that while :meth:`hold` is in force a
    PUT whose path ends in ``suffix`` waits until :meth:`release` (or 120 s)
    before it goes on; ``holding`` is set once one waits. The server's
    answers are passed back byte for byte."""

    def __init__(self, upstream: str, suffix: str) -> None:
        import socket
        from urllib.parse import urlsplit

        up = urlsplit(upstream)
        self._upstream = (up.hostname, up.port)
        self._suffix = suffix.encode()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open = threading.Event()
        self._open.set()
        self.holding = threading.Event()
        self._sockets: list = []
        threading.Thread(target=self._accept, name="s3-proxy", daemon=True).start()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.release()
        for s in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> HoldingProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream, timeout=10)
            server.settimeout(None)
            self._sockets += [client, server]
            threading.Thread(target=self._answers, args=(server, client), daemon=True).start()
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()

    @staticmethod
    def _answers(server, client) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(1 << 16):
                client.sendall(data)
        with contextlib.suppress(OSError):
            client.shutdown(2)

    def _requests(self, client, server) -> None:
        buf = b""
        with contextlib.suppress(OSError):
            while True:
                while b"\r\n\r\n" not in buf:
                    data = client.recv(1 << 16)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.split(b"\r\n")
                method, path = lines[0].split(b" ")[:2]
                headers = dict(line.split(b":", 1) for line in lines[1:])
                headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
                if headers.get(b"transfer-encoding"):
                    raise AssertionError(f"a chunked request the proxy cannot frame: {lines[0]!r}")
                length = int(headers.get(b"content-length", b"0"))
                while len(buf) < length:
                    data = client.recv(1 << 16)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                if method == b"PUT" and path.split(b"?")[0].endswith(self._suffix) and not self._open.is_set():
                    self.holding.set()
                    self._open.wait(timeout=120)
                server.sendall(head + b"\r\n\r\n" + body)
