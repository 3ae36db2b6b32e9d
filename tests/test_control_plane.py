"""The control plane lets no one in and shows nothing: while a real run goes
on, clients that stay silent, skip the handshake, hold a wrong token, send
garbage, an oversized length or speak another protocol version are each
cut off, and the run finishes with every report. A client with the right
token (read from the owner-only token file) completes the Noise handshake,
so the harness itself is shown to speak the protocol; a frame it alters
after the handshake, and a recording of its connection replayed on a new
one, are rejected, closed and recorded as `frame_rejected` events.
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
import time

import pytest
from conftest import HELLO, SCRIPTS, assert_none_left, cli, meshrun, read_jsonl, start, stop, wait_for
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from errors_page import covers, exits

# meshrun-protocol's PROTOCOL_VERSION: this test speaks the handshake
# itself. The run's own record says which it speaks (checked below).
VERSION = 12
PATTERN = b"Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s"
PROLOGUE = b"meshrun control protocol, version"


# The client's side of the Noise NNpsk0 handshake (noiseprotocol.org,
# revision 34), as meshrun's Rust client does it with the `snow` crate.

def _blake2s(data: bytes) -> bytes:
    return hashlib.blake2s(data).digest()


def _hkdf(chaining_key: bytes, material: bytes, outputs: int) -> list[bytes]:
    temp = hmac.new(chaining_key, material, hashlib.blake2s).digest()
    out, last = [], b""
    for i in range(1, outputs + 1):
        last = hmac.new(temp, last + bytes([i]), hashlib.blake2s).digest()
        out.append(last)
    return out


def _nonce(n: int) -> bytes:
    return b"\0" * 4 + n.to_bytes(8, "little")


class NoiseClient:
    """One connection's handshake and transport keys."""

    # The claim of a holder of the run token: a role byte 0, attempt and
    # rank 0. It goes in front of the first message and into the prologue.
    CLAIM = bytes(9)

    def __init__(self, token: bytes, version: int = VERSION):
        self.h = _blake2s(PATTERN)
        self.ck = self.h
        self._mix_hash(PROLOGUE + bytes([version]) + self.CLAIM)
        self.token = token
        self.e = X25519PrivateKey.generate()

    def _mix_hash(self, data: bytes) -> None:
        self.h = _blake2s(self.h + data)

    def _mix_key(self, material: bytes) -> None:
        self.ck, self.k = _hkdf(self.ck, material, 2)

    def first_message(self) -> bytes:
        """The claim, psk, e, and the tag of an empty payload, behind its length."""
        self.ck, temp_h, self.k = _hkdf(self.ck, self.token, 3)
        self._mix_hash(temp_h)
        e_pub = self.e.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self._mix_hash(e_pub)
        self._mix_key(e_pub)
        tag = ChaCha20Poly1305(self.k).encrypt(_nonce(0), b"", self.h)
        self._mix_hash(tag)
        message = self.CLAIM + e_pub + tag
        return struct.pack(">H", len(message)) + message

    def read_answer(self, message: bytes) -> None:
        """e, ee and the server's tag; raises when the server does not hold the token."""
        re, tag = message[:32], message[32:]
        self._mix_hash(re)
        self._mix_key(re)
        self._mix_key(self.e.exchange(X25519PublicKey.from_public_bytes(re)))
        ChaCha20Poly1305(self.k).decrypt(_nonce(0), tag, self.h)
        self._mix_hash(tag)
        self.send_key, self.receive_key = _hkdf(self.ck, b"", 2)
        self.sent = 0

    def seal(self, message: dict) -> bytes:
        """One frame of a small message: a single piece that is its last."""
        body = bytes([VERSION]) + json.dumps(message).encode() + b"\0"
        piece = ChaCha20Poly1305(self.send_key).encrypt(_nonce(self.sent), body, b"")
        self.sent += 1
        return struct.pack(">H", len(piece)) + piece


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
    (whatever it sent before)."""
    deadline = time.monotonic() + within
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(4096):
                return True
        return False
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.close()


def handshake(address: tuple[str, int], token: bytes) -> tuple[socket.socket, NoiseClient, bytes]:
    """A connection that has passed the handshake, its keys and the bytes it sent."""
    sock = socket.create_connection(address, timeout=5)
    noise = NoiseClient(token)
    first = noise.first_message()
    try:
        sock.sendall(first)
        head = _read_exact(sock, 2)
        assert head is not None and struct.unpack(">H", head)[0] == 48, f"the server answered {head!r} (is VERSION meshrun's protocol version?)"
        noise.read_answer(_read_exact(sock, 48))
    except BaseException:
        sock.close()
        raise
    return sock, noise, first


def connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=5)


@pytest.mark.slow
def test_intruders_are_refused_while_a_run_goes_on(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "cp"
    proc = start(["-n", "2", "--platform", "cpu", "--tee", "none", str(SCRIPTS / "steady_reporter.py"), "160"], runs_dir=runs, name="cp")
    try:
        wait_for(lambda: proc.poll() is not None or any((r["step"] or 0) >= 3 for r in read_jsonl(run_dir / "metrics.jsonl")), 60, "reports")
        assert proc.poll() is None, proc.communicate()[1]
        record = json.loads((run_dir / "run.json").read_text())
        assert record["versions"]["protocol"] == VERSION, f"the run speaks protocol version {record['versions']['protocol']}: set VERSION to it"
        control = record["attempts"][-1]["control"]
        assert control["loopback_only"] is True
        host, port = control["bind"].rsplit(":", 1)
        address = (host, int(port))
        token_file = run_dir / "token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = bytes.fromhex(token_file.read_text())

        # The right token is let in: the server's answer opens with our
        # keys. A heartbeat, sealed right, is not a hello: the server closes
        # the connection, without a rejection.
        sock, noise, first = handshake(address, token)
        heartbeat = noise.seal({"type": "heartbeat"})
        sock.sendall(heartbeat)
        assert closed_by_server(sock, 3)

        rejected_from = []
        # A frame altered after the handshake.
        sock, noise, _ = handshake(address, token)
        rejected_from.append("%s:%d" % sock.getsockname())
        altered = bytearray(noise.seal({"type": "heartbeat"}))
        altered[10] ^= 0x01
        sock.sendall(bytes(altered))
        altered_closed = closed_by_server(sock, 3)
        # The first connection, recorded and replayed on a new one: the
        # server answers the handshake, then rejects the frame.
        sock = connect(address)
        rejected_from.append("%s:%d" % sock.getsockname())
        sock.sendall(first + heartbeat)
        replay_closed = closed_by_server(sock, 3)
        assert altered_closed and replay_closed, (altered_closed, replay_closed)

        refused = {}
        # A wrong token.
        sock = connect(address)
        sock.sendall(NoiseClient(os.urandom(32)).first_message())
        refused["wrong token"] = closed_by_server(sock, 3)
        # No handshake: straight to a report, as the old protocol framed it.
        sock = connect(address)
        body = bytes([1]) + json.dumps({"type": "report", "step": 999, "metrics": {"loss": -1.0}}).encode()
        sock.sendall(struct.pack(">I", len(body)) + body)
        refused["no handshake"] = closed_by_server(sock, 3)
        # Garbage bytes.
        sock = connect(address)
        sock.sendall(os.urandom(4096))
        refused["garbage"] = closed_by_server(sock, 3)
        # A length over any handshake message: refused before anything is read.
        sock = connect(address)
        sock.sendall(struct.pack(">H", 0xFFFF) + b"x" * 1024)
        refused["oversized"] = closed_by_server(sock, 3)
        # The right token, another protocol version.
        sock = connect(address)
        sock.sendall(NoiseClient(token, version=99).first_message())
        refused["other version"] = closed_by_server(sock, 3)
        # A truncated message, then silence: dropped at the handshake timeout.
        sock = connect(address)
        sock.sendall(struct.pack(">H", 48) + b"{")
        refused["truncated"] = closed_by_server(sock, 8)
        # Silence.
        sock = connect(address)
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
    events = read_jsonl(run_dir / "events.jsonl")
    assert not [e for e in events if e["event"] == "worker_failed"]
    rejections = [e for e in events if e["event"] == "frame_rejected"]
    assert sorted(e["peer"] for e in rejections) == sorted(rejected_from), rejections
    assert all(e["attempt"] == 1 and "does not authenticate" in e["reason"] for e in rejections), rejections
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
