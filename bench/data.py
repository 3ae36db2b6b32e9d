"""Data loader throughput, measured side by side in one run.

Every loader delivers the same thing: shuffled batches of 32 windows of
seq_len + 1 = 1025 uint16 tokens, window i starting at token i * 1024 (the
windows of ``meshrun.data.tokens``). Each is timed for ``--seconds`` after
one warm-up batch (start-up, worker spawn and first shuffle are not counted),
``--repeats`` times with the loader order rotated each repeat, and the median
samples/s and MB/s delivered (MB = bytes of the batches / 1e6) are reported:

  - meshrun, token file:  Loader(tokens(path, "uint16", 1024), 32,
    shuffle=True, threads=T), T = 1 and 2
  - meshrun, Parquet:     Loader(parquet(path, ["tokens"], seq_len=1024), ...),
    T = 1 and 2; the source decodes the file when opened, that open is timed
    and reported on its own, not in samples/s
  - numpy memmap loop:    a seeded permutation of window indices per epoch and
    ``mm[starts[:, None] + np.arange(1025)]`` per batch, in the main thread
  - Grain, in process:    MapDataset.source(windows of the memmap)
    .shuffle(seed=0).repeat().batch(32), read by one prefetch thread
  - Grain, 2 processes:   the same pipeline with mp_prefetch(num_workers=2,
    per_worker_buffer_size=4)
  - Ray Data:             ray.data.range(windows).random_shuffle(seed=0)
    .map_batches(gather the windows from the memmap), then
    iter_batches(batch_size=32, batch_format="numpy"); Ray on loopback with
    num_cpus=2, started before and shut down after each Ray measurement so
    its processes do not load the machine while the others are measured

Object storage (``--s3``, on by default; SeaweedFS on loopback, started and
stopped by the benchmark, the same files uploaded into it):

  - before each measurement the benchmark waits until the server is idle
    (SeaweedFS works on its volumes for a while after uploads and deletes)
  - raw GET bandwidth: one object the size of the token file downloaded by
    meshrun's storage client (ranged GETs of 8 MiB, 16 in flight), median
  - meshrun, token file in S3, cold: a fresh source (empty block cache),
    one whole shuffled epoch with 2 threads, timed from opening the source;
    its fetch rate is the bytes fetched / that time
  - meshrun, token file in S3, warm: the same source's next epoch, timed as
    the local loaders (every block is in the cache on the scratch disk)
  - meshrun, Parquet in S3: opening it (the whole file fetched and decoded,
    as it fits in max_memory) cold, then batches as above

The test files are written once into ``--dir`` (default bench/out/data) and
reused while their size matches: a flat uint16 token file of ``--gb`` GB and
a Parquet file with one list<uint16> column ``tokens`` (lists of 200..4000
tokens, ``--parquet-mb`` MB of tokens, several row groups).

    python bench/data.py [--gb 1.0] [--parquet-mb 200] [--seconds 5] [--repeats 3] [--no-s3] [--dir DIR] [--json OUT]
    python bench/data.py --small --dir /tmp/d   # smoke run: tiny files, no Ray, no Grain processes
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from common import publish

HERE = Path(__file__).resolve().parent
SEQ_LEN = 1024
WINDOW = SEQ_LEN + 1
VOCAB = 50257
TOKEN_FILE = "tokens_uint16.bin"
PARQUET_FILE = "tokens.parquet"


# --------------------------------------------------------------------------
# Test files


def write_token_file(path: Path, n_tokens: int) -> bool:
    """Writes ``n_tokens`` deterministic uint16 tokens unless the file already has that size."""
    if path.exists() and path.stat().st_size == 2 * n_tokens:
        return False
    rng = np.random.default_rng(0)
    chunk = 1 << 25  # 32M tokens, 64 MB per write
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        left = n_tokens
        while left:
            n = min(chunk, left)
            rng.integers(0, VOCAB, size=n, dtype=np.uint16).tofile(f)
            left -= n
    tmp.replace(path)
    return True


def parquet_tokens(path: Path) -> int | None:
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
        return int(meta[b"bench_tokens"])
    except Exception:  # missing, partial or foreign file: write it again
        return None


def write_parquet_file(path: Path, n_tokens: int, row_groups: int = 8) -> bool:
    """Writes lists of 200..4000 tokens, ~``n_tokens`` in all, in ``row_groups`` row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    per_group = n_tokens // row_groups
    lengths_all: list[np.ndarray] = []
    for _ in range(row_groups):
        lengths = rng.integers(200, 4001, size=per_group // 200 + 1, dtype=np.int32)
        lengths_all.append(lengths[: max(1, int(np.searchsorted(np.cumsum(lengths), per_group, side="right")))])
    total = int(sum(int(x.sum()) for x in lengths_all))
    if path.exists() and parquet_tokens(path) == total:
        return False
    schema = pa.schema([("tokens", pa.list_(pa.uint16()))], metadata={"bench_tokens": str(total)})
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, schema) as writer:
        for lengths in lengths_all:
            values = rng.integers(0, VOCAB, size=int(lengths.sum()), dtype=np.uint16)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            col = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
            writer.write_table(pa.table({"tokens": col}, schema=schema), row_group_size=len(lengths))
    tmp.replace(path)
    return True


# --------------------------------------------------------------------------
# Measuring


def measure(make: Callable[[], tuple[Iterator[np.ndarray], Callable[[], None]]], seconds: float, batch: int) -> dict[str, float]:
    """Times ``seconds`` of batches from a fresh iterator, after one warm-up batch."""
    t_start = time.perf_counter()
    it, close = make()
    try:
        first = next(it)
        first_s = time.perf_counter() - t_start
        assert first.shape == (batch, WINDOW) and first.dtype == np.uint16, (first.shape, first.dtype)
        n = nbytes = 0
        t0 = time.perf_counter()
        while True:
            b = next(it)
            n += b.shape[0]
            nbytes += b.nbytes
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
    finally:
        close()
    return {"samples_per_s": n / elapsed, "mb_per_s": nbytes / elapsed / 1e6, "samples": n, "seconds": elapsed, "first_batch_s": first_s}


def meshrun_tokens(path: Path, batch: int, threads: int):
    def make():
        import meshrun.data as md

        loader = md.Loader(md.tokens(path, "uint16", SEQ_LEN), batch, seed=0, shuffle=True, threads=threads, rank=0, num_processes=1)
        return (b["tokens"] for b in loader), lambda: None

    return make


def meshrun_parquet(path: Path, batch: int, threads: int, opens: list[float]):
    def make():
        import meshrun.data as md

        t0 = time.perf_counter()
        source = md.parquet(path, ["tokens"], seq_len=SEQ_LEN)
        opens.append(time.perf_counter() - t0)
        loader = md.Loader(source, batch, seed=0, shuffle=True, threads=threads, rank=0, num_processes=1)
        return (b["tokens"] for b in loader), lambda: None

    return make


def numpy_loop(path: Path, batch: int):
    def make():
        def gen():
            mm = np.memmap(path, dtype=np.uint16, mode="r")
            n = (len(mm) - 1) // SEQ_LEN
            ar = np.arange(WINDOW)
            epoch = 0
            while True:
                perm = np.random.default_rng([0, epoch]).permutation(n)
                for s in range(n // batch):
                    starts = perm[s * batch : (s + 1) * batch] * SEQ_LEN
                    yield mm[starts[:, None] + ar]
                epoch += 1

        return gen(), lambda: None

    return make


class Windows:
    """Grain random-access source: window i of the token file (memmap opened lazily, so it pickles)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.n = (os.path.getsize(path) // 2 - 1) // SEQ_LEN
        self._mm: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint16, mode="r")
        s = int(i) * SEQ_LEN
        return np.asarray(self._mm[s : s + WINDOW])  # a view; batch() copies it once

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "n": self.n, "_mm": None}


def grain_pipeline(path: Path, batch: int, workers: int):
    def make():
        import grain

        ds = grain.MapDataset.source(Windows(str(path))).shuffle(seed=0).repeat().batch(batch, drop_remainder=True)
        if workers:
            from absl import flags

            if not flags.FLAGS.is_parsed():
                flags.FLAGS(sys.argv[:1])
            it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0)).mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=4))
        else:
            it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4))
        it = iter(it_ds)
        return it, getattr(it, "close", lambda: None)

    return make


def _ray_gather(rows: dict[str, np.ndarray], path: str) -> dict[str, np.ndarray]:
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    starts = rows["id"].astype(np.int64) * SEQ_LEN
    return {"tokens": mm[starts[:, None] + np.arange(WINDOW)]}


def ray_data(path: Path, batch: int):
    def make():
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        import ray

        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False, logging_level="ERROR")
        ray.data.DataContext.get_current().enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        n = (os.path.getsize(path) // 2 - 1) // SEQ_LEN

        def gen():
            epoch = 0
            while True:
                ds = ray.data.range(n).random_shuffle(seed=epoch).map_batches(_ray_gather, fn_kwargs={"path": str(path)}, batch_size=1024, batch_format="numpy")
                for b in ds.iter_batches(batch_size=batch, batch_format="numpy", drop_last=True):
                    yield b["tokens"]
                epoch += 1

        it = gen()

        def close() -> None:
            it.close()  # stop Ray's iterator while Ray is still up
            ray.shutdown()

        return it, close

    return make


# --------------------------------------------------------------------------
# Object storage


def upload(server, local: Path, key: str) -> None:
    with open(local, "rb") as src, server.filesystem().open_output_stream(key) as dst:
        while chunk := src.read(64 << 20):
            dst.write(chunk)


def wait_quiet(pid: int, limit_s: float = 60.0) -> float:
    """Waits until process ``pid`` (the S3 server) uses under 5% of a CPU
    over half a second, at most ``limit_s``: after uploads and deletes
    SeaweedFS works on its volumes for a while, on the same 2 cores the
    loader is measured on. Returns the seconds waited."""
    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        before = cpu()
        time.sleep(0.5)
        if cpu() - before < 0.025:
            break
    return time.perf_counter() - t0


def scratch_write_mb_s(size: int) -> float:
    """MB/s of writing ``size`` bytes of new data into the scratch folder
    the block cache lives in, as the cache writes it (4 MiB pieces, two
    threads, each its own file, no fsync): a cold epoch must write every
    byte it fetches there, so this is the machine's own bound on it."""
    import tempfile
    import threading

    piece = os.urandom(4 << 20)
    scratch = os.environ.get("MESHRUN_SCRATCH") or tempfile.gettempdir()
    files = [tempfile.TemporaryFile(dir=scratch) for _ in range(2)]

    def write(f, n: int) -> None:
        for i in range(n):
            os.pwrite(f.fileno(), piece, i * len(piece))

    per = size // len(piece) // 2
    threads = [threading.Thread(target=write, args=(f, per)) for f in files]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    for f in files:
        f.close()
    return 2 * per * len(piece) / elapsed / 1e6


def epoch_bytes(source, batch: int) -> int:
    import meshrun.data as md

    loader = md.Loader(source, batch, seed=0, shuffle=True, threads=2, rank=0, num_processes=1, num_epochs=1)
    return sum(b["tokens"].nbytes for b in loader)


def s3_rows(tok_path: Path, pq_path: Path, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The token file and the Parquet file read from a SeaweedFS on loopback: cold and warm."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from s3server import S3Server

    import meshrun.data as md
    from meshrun import _native

    B = args.batch
    saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    with S3Server(folder) as server:
        os.environ.update({k: v for k, v in server.env().items() if k.startswith("AWS_")})
        try:
            bucket = server.bucket("meshrun-bench-data")
            upload(server, tok_path, f"{bucket[5:]}/{TOKEN_FILE}")
            upload(server, pq_path, f"{bucket[5:]}/{PARQUET_FILE}")
            size = tok_path.stat().st_size
            runs: dict[str, list[float]] = {k: [] for k in ("get", "scratch_write", "tok_cold_s", "tok_cold_fetch", "tok_cold_mb", "tok_warm", "pq_open_s", "pq_fetch", "pq_warm")}
            for r in range(args.repeats):
                wait_quiet(server.proc.pid)
                t0 = time.perf_counter()
                src = md.tokens(f"{bucket}/{TOKEN_FILE}", "uint16", SEQ_LEN)
                delivered = epoch_bytes(src, B)
                cold = time.perf_counter() - t0
                runs["tok_cold_s"].append(cold)
                runs["tok_cold_fetch"].append(src.fetched_bytes / cold / 1e6)
                runs["tok_cold_mb"].append(delivered / cold / 1e6)
                fetched = src.fetched_bytes
                wait_quiet(server.proc.pid)
                warm = measure(lambda: (iter(b["tokens"] for b in md.Loader(src, B, seed=1, shuffle=True, threads=2, rank=0, num_processes=1)), lambda: None), args.seconds, B)
                assert src.fetched_bytes == fetched, "the warm epoch fetched from the server"
                runs["tok_warm"].append(warm["mb_per_s"])
                del src
                wait_quiet(server.proc.pid)
                t0 = time.perf_counter()
                pq = md.parquet(f"{bucket}/{PARQUET_FILE}", ["tokens"], seq_len=SEQ_LEN)
                opened = time.perf_counter() - t0
                runs["pq_open_s"].append(opened)
                runs["pq_fetch"].append(pq.fetched_bytes / opened / 1e6)
                wait_quiet(server.proc.pid)
                warm = measure(lambda: (iter(b["tokens"] for b in md.Loader(pq, B, seed=1, shuffle=True, threads=2, rank=0, num_processes=1)), lambda: None), args.seconds, B)
                runs["pq_warm"].append(warm["mb_per_s"])
                del pq
                # Last: its upload and delete leave the server busy for a while.
                wait_quiet(server.proc.pid)
                _, down = _native.storage_roundtrip(f"{bucket}/raw", size)
                runs["get"].append(size / down / 1e6)
                wait_quiet(server.proc.pid)
                runs["scratch_write"].append(scratch_write_mb_s(size))
                print(f"repeat {r + 1}/{args.repeats}  s3: GET {runs['get'][-1]:.0f} MB/s, scratch write {runs['scratch_write'][-1]:.0f} MB/s, tokens cold fetch {runs['tok_cold_fetch'][-1]:.0f} MB/s, warm {runs['tok_warm'][-1]:.0f} MB/s", file=sys.stderr)
        finally:
            for k in [k for k in os.environ if k.startswith("AWS_")]:
                del os.environ[k]
            os.environ.update(saved)
    return {k: statistics.median(v) for k, v in runs.items()} | {"runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=HERE / "out" / "data")
    parser.add_argument("--gb", type=float, default=1.0, help="size of the token file")
    parser.add_argument("--parquet-mb", type=float, default=200.0, help="MB of tokens in the Parquet file")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="smoke run: 20 MB + 5 MB files, 0.5 s, 1 repeat, no Ray, no Grain processes")
    parser.add_argument("--no-s3", dest="s3", action="store_false", help="leave out the object-storage rows")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.small:
        args.gb, args.parquet_mb, args.seconds, args.repeats = 0.02, 5.0, 0.5, 1

    args.dir.mkdir(parents=True, exist_ok=True)
    tok_path, pq_path = args.dir / TOKEN_FILE, args.dir / PARQUET_FILE
    t0 = time.perf_counter()
    wrote = write_token_file(tok_path, int(args.gb * 1e9) // 2)
    wrote = write_parquet_file(pq_path, int(args.parquet_mb * 1e6) // 2) or wrote
    if wrote:
        print(f"wrote test files in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    pq_tokens = parquet_tokens(pq_path)

    B = args.batch
    parquet_opens: dict[int, list[float]] = {1: [], 2: []}
    # (key, loader, source, threads/workers, factory)
    loaders: list[tuple[str, str, str, int, Callable]] = [
        ("meshrun_tokens_t1", "meshrun", "token file", 1, meshrun_tokens(tok_path, B, 1)),
        ("meshrun_tokens_t2", "meshrun", "token file", 2, meshrun_tokens(tok_path, B, 2)),
        ("meshrun_parquet_t1", "meshrun", "parquet", 1, meshrun_parquet(pq_path, B, 1, parquet_opens[1])),
        ("meshrun_parquet_t2", "meshrun", "parquet", 2, meshrun_parquet(pq_path, B, 2, parquet_opens[2])),
        ("numpy_memmap", "numpy memmap loop", "token file", 1, numpy_loop(tok_path, B)),
        ("grain_inprocess", "Grain (in process)", "token file", 1, grain_pipeline(tok_path, B, 0)),
    ]
    if not args.small:
        loaders.append(("grain_mp2", "Grain (mp_prefetch)", "token file", 2, grain_pipeline(tok_path, B, 2)))
        loaders.append(("ray_data", "Ray Data", "token file", 2, ray_data(tok_path, B)))

    runs: dict[str, list[dict[str, float]]] = {key: [] for key, *_ in loaders}
    for r in range(args.repeats):
        # Rotate the order so drift on a noisy machine hits every loader.
        k = r % len(loaders)
        for key, name, source, threads, make in loaders[k:] + loaders[:k]:
            m = measure(make, args.seconds, B)
            runs[key].append(m)
            print(f"repeat {r + 1}/{args.repeats}  {key:20s} {m['samples_per_s']:10.0f} samples/s {m['mb_per_s']:8.1f} MB/s", file=sys.stderr)

    s3 = None
    if args.s3:
        import tempfile

        with tempfile.TemporaryDirectory(dir=args.dir, prefix="s3-") as tmp:
            s3 = s3_rows(tok_path, pq_path, args, Path(tmp))

    rows: dict[str, dict[str, Any]] = {}
    for key, name, source, threads, _ in loaders:
        rows[key] = {
            "loader": name,
            "source": source,
            "threads_or_workers": threads,
            "samples_per_s": statistics.median(m["samples_per_s"] for m in runs[key]),
            "mb_per_s": statistics.median(m["mb_per_s"] for m in runs[key]),
            "first_batch_s": statistics.median(m["first_batch_s"] for m in runs[key]),
            "runs": runs[key],
        }
    open_s = {t: statistics.median(v) for t, v in parquet_opens.items() if v}
    ratio = rows["meshrun_tokens_t2"]["mb_per_s"] / rows["numpy_memmap"]["mb_per_s"]
    reached = rows["meshrun_tokens_t2"]["mb_per_s"] >= 1000.0
    result = {
        "batch": B,
        "window_tokens": WINDOW,
        "batch_mb": B * WINDOW * 2 / 1e6,
        "seconds_per_measurement": args.seconds,
        "repeats": args.repeats,
        "small": args.small,
        "cpus": os.cpu_count(),
        "token_file": {"path": str(tok_path), "bytes": tok_path.stat().st_size, "windows": (tok_path.stat().st_size // 2 - 1) // SEQ_LEN},
        "parquet_file": {"path": str(pq_path), "bytes": pq_path.stat().st_size, "tokens": pq_tokens},
        "meshrun_parquet_open_s": {str(t): v for t, v in open_s.items()},
        "meshrun_parquet_open_runs_s": {str(t): v for t, v in parquet_opens.items()},
        "loaders": rows,
        "ratio_meshrun_t2_over_numpy": ratio,
        "meshrun_t2_reached_1GBps": reached,
    }

    title = (
        f"data loaders: shuffled batches of {B} x {WINDOW} uint16 tokens ({B * WINDOW * 2 / 1e6:.3f} MB), "
        f"token file {tok_path.stat().st_size / 1e9:.2f} GB, Parquet {2 * (pq_tokens or 0) / 1e6:.0f} MB of tokens, "
        f"median of {args.repeats} x {args.seconds:g} s, {os.cpu_count()} CPUs"
    )
    print(title)
    print("| loader | source | threads/workers | samples/s | MB/s |")
    print("| --- | --- | --- | ---: | ---: |")
    for row in rows.values():
        print(f"| {row['loader']} | {row['source']} | {row['threads_or_workers']} | {row['samples_per_s']:,.0f} | {row['mb_per_s']:,.1f} |")
    print()
    s3_lines = []
    if s3:
        local_tok, local_pq = rows["meshrun_tokens_t2"]["mb_per_s"], rows["meshrun_parquet_t2"]["mb_per_s"]
        result["s3"] = s3 | {
            "warm_over_local_tokens": s3["tok_warm"] / local_tok,
            "cold_fetch_over_get": s3["tok_cold_fetch"] / s3["get"],
            "cold_fetch_over_scratch_write": s3["tok_cold_fetch"] / s3["scratch_write"],
            "warm_over_local_parquet": s3["pq_warm"] / local_pq,
            "parquet_fetch_over_get": s3["pq_fetch"] / s3["get"],
        }
        print("object storage (SeaweedFS on loopback), meshrun, 2 threads, medians:")
        print("| source | cold: first epoch / open | cold: fetched MB/s | warm: MB/s delivered | local: MB/s delivered |")
        print("| --- | ---: | ---: | ---: | ---: |")
        print(f"| token file | {s3['tok_cold_s']:.2f} s epoch | {s3['tok_cold_fetch']:,.0f} | {s3['tok_warm']:,.0f} | {local_tok:,.0f} |")
        print(f"| Parquet | {s3['pq_open_s']:.2f} s open | {s3['pq_fetch']:,.0f} | {s3['pq_warm']:,.0f} | {local_pq:,.0f} |")
        print(f"| raw GET, one object of the token file's size | | {s3['get']:,.0f} | | |")
        print(f"| writing as much new data into the scratch folder | | {s3['scratch_write']:,.0f} | | |")
        print()
        s3_lines = [
            ("S3 warm / local, token file (MB/s delivered)", f"{result['s3']['warm_over_local_tokens']:.2f}x"),
            ("S3 cold fetch rate / raw GET bandwidth, token file", f"{result['s3']['cold_fetch_over_get']:.2f}x"),
            ("S3 cold fetch rate / scratch folder write rate, token file", f"{result['s3']['cold_fetch_over_scratch_write']:.2f}x"),
            ("S3 warm / local, Parquet (MB/s delivered)", f"{result['s3']['warm_over_local_parquet']:.2f}x"),
            ("S3 Parquet open fetch rate / raw GET bandwidth", f"{result['s3']['parquet_fetch_over_get']:.2f}x"),
        ]
    publish(
        "summary",
        ("measure", "value"),
        [
            ("meshrun 2 threads / numpy memmap loop (token file, MB/s)", f"{ratio:.2f}x"),
            ("meshrun 2 threads reached 1 GB/s (token file)", "yes" if reached else "no"),
            *[(f"meshrun Parquet open (decode), {t} thread(s) run, median s", f"{v:.2f}") for t, v in open_s.items()],
            *s3_lines,
        ],
        f"meshrun 2 threads: {rows['meshrun_tokens_t2']['mb_per_s']:,.0f} MB/s; numpy memmap loop: {rows['numpy_memmap']['mb_per_s']:,.0f} MB/s",
        result,
        args.json,
    )


if __name__ == "__main__":
    main()
