"""The control plane lets no one in: while a real run goes on, clients that
stay silent, skip the handshake, prove a wrong token, send garbage, an
oversized length or another protocol version are each cut off, and the run
finishes with every report. A client with the right token (read from the
owner-only token file) is let in, so the harness itself is shown to work.
A --control-port that another program holds is refused before anything
starts; a free one is kept by every attempt."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import stat
import struct

import pytest
from conftest import HELLO, SCRIPTS, assert_none_left, cli, meshrun, read_jsonl, start, stop, wait_for
from errors_page import covers, exits

VERSION = 1


def frame(message: dict, version: int = VERSION) -> bytes:
    body = bytes([version]) + json.dumps(message).encode()
    return struct.pack(">I", len(body)) + body


def read_frame(sock: socket.socket) -> dict | None:
    """The next message, or None when the server closed the connection."""
    head = _read_exact(sock, 4)
    if head is None:
        return None
    body = _read_exact(sock, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body[1:])


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """True when the server ends the connection within ``within`` seconds
    without sending anything more."""
    sock.settimeout(within)
    try:
        return read_frame(sock) is None
    except TimeoutError:
        return False
    finally:
        sock.close()


def challenge(address: tuple[str, int]) -> tuple[socket.socket, str]:
    sock = socket.create_connection(address, timeout=5)
    first = read_frame(sock)
    assert first is not None and first["type"] == "challenge", first
    return sock, first["nonce"]


def mac(key: bytes, label: bytes, nonce: str) -> str:
    return hmac.new(key, label + nonce.encode(), hashlib.sha256).hexdigest()


@pytest.mark.slow
def test_intruders_are_refused_while_a_run_goes_on(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "cp"
    proc = start(["-n", "2", "--platform", "cpu", "--tee", "none", str(SCRIPTS / "steady_reporter.py"), "160"], runs_dir=runs, name="cp")
    try:
        wait_for(lambda: proc.poll() is not None or any((r["step"] or 0) >= 3 for r in read_jsonl(run_dir / "metrics.jsonl")), 60, "reports")
        assert proc.poll() is None, proc.communicate()[1]
        record = json.loads((run_dir / "run.json").read_text())
        control = record["attempts"][-1]["control"]
        assert control["loopback_only"] is True
        host, port = control["bind"].rsplit(":", 1)
        address = (host, int(port))
        token_file = run_dir / "token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = bytes.fromhex(token_file.read_text())

        # The right token is let in: the harness speaks the protocol.
        sock, nonce = challenge(address)
        sock.sendall(frame({"type": "auth", "mac": mac(token, b"client", nonce), "nonce": "ab" * 32}))
        welcome = read_frame(sock)
        assert welcome is not None and welcome["type"] == "welcome"
        assert hmac.compare_digest(welcome["mac"], mac(token, b"server", "ab" * 32))
        sock.close()

        refused = {}
        # A wrong token.
        sock, nonce = challenge(address)
        sock.sendall(frame({"type": "auth", "mac": mac(os.urandom(32), b"client", nonce), "nonce": "cd" * 32}))
        refused["wrong token"] = closed_by_server(sock, 3)
        # No handshake: straight to a report.
        sock, _ = challenge(address)
        sock.sendall(frame({"type": "report", "step": 999, "metrics": {"loss": -1.0}}))
        refused["no handshake"] = closed_by_server(sock, 3)
        # Garbage bytes.
        sock, _ = challenge(address)
        sock.sendall(os.urandom(4096))
        refused["garbage"] = closed_by_server(sock, 3)
        # A length far over the 1 MiB limit: refused before anything is read.
        sock, _ = challenge(address)
        sock.sendall(struct.pack(">I", 0x7FFFFFF0) + b"x" * 1024)
        refused["oversized"] = closed_by_server(sock, 3)
        # A frame of another protocol version.
        sock, nonce = challenge(address)
        sock.sendall(frame({"type": "auth", "mac": mac(token, b"client", nonce), "nonce": "ef" * 32}, version=99))
        refused["other version"] = closed_by_server(sock, 3)
        # A truncated frame, then silence: dropped at the handshake timeout.
        sock, _ = challenge(address)
        sock.sendall(struct.pack(">I", 100) + b"{")
        refused["truncated"] = closed_by_server(sock, 8)
        # Silence.
        sock, _ = challenge(address)
        refused["silent"] = closed_by_server(sock, 8)
        assert all(refused.values()), refused
        assert proc.poll() is None, "an intruder stopped the run"
        _, err = proc.communicate(timeout=120)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert steps == list(range(1, 161)), "reports were lost or an intruder's report was recorded"
    assert all((run_dir / f"sent-{r}").read_text() == "160" for r in (0, 1))
    assert not [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "worker_failed"]
    assert token.hex() not in (err + "".join(p.read_text() for p in (run_dir / "logs").iterdir()))
    assert_none_left(run_dir)


# The control port a user asks for: refused when taken (a row of
# docs/errors.md), used by every attempt when free.

@covers("run-control-port-in-use")
def test_control_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("run", "--runs-dir", tmp_path / "runs", "--control-port", port, HELLO)
        exits("run-control-port-in-use", proc)
        assert f"--control-port {port} on 127.0.0.1 is in use" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_free_control_port_is_used_by_every_attempt(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = meshrun(["-n", "2", "--tee", "none", "--control-port", str(port), "--max-failures", "1", str(SCRIPTS / "fail_once.py")], runs_dir=tmp_path / "runs")
    assert done.code == 0, done.stderr
    bound = [e["control_addr"] for e in done.events() if e["event"] == "attempt_started"]
    assert bound == [f"127.0.0.1:{port}"] * 2
