"""Restore time with and without verifying the digests, on a >= 1 GB checkpoint.

    python benchmarks/restore_verify.py [--gib 1.0] [--repeats 5] [--where local,gcs]

Saves one checkpoint of float32 arrays (total `--gib` GiB) with `Checkpointer`,
then times, interleaved and `--repeats` times each: `restore` alone, and
`integrity.verify` (its cache dropped first) followed by `restore`. `gcs` runs
against fake-gcs-server (started here, memory backend). Prints medians and
ranges in seconds and the ratio of the medians. Locally both read the files
from the page cache (the checkpoint was just written; no cache is dropped).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, _ROOT)


def _bench(directory: str, gib: float, repeats: int) -> dict:
    import jax
    import numpy as np

    from tpu_estimator.checkpoint import integrity
    from tpu_estimator.checkpoint.manager import Checkpointer

    n = int(gib * (1 << 30) / 4 / 8)
    state = {f"w{i}": np.random.default_rng(i).standard_normal(n, dtype=np.float32) for i in range(8)}
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    state = {k: jax.device_put(v, sharding) for k, v in state.items()}
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in state.items()}
    ckpt = Checkpointer(directory)
    t = time.perf_counter()
    ckpt.save(1, state)
    ckpt.wait()
    save_s = time.perf_counter() - t
    del state
    jax.block_until_ready(ckpt.restore(1, abstract))  # warm-up (one-time costs), not timed
    times: dict[str, list[float]] = {"restore": [], "verify+restore": [], "verify": []}
    for _ in range(repeats):
        for mode in ("restore", "verify+restore"):
            t = time.perf_counter()
            if mode == "verify+restore":
                integrity.forget()
                assert integrity.verify(directory, 1, [1]).intact
                times["verify"].append(time.perf_counter() - t)
            out = ckpt.restore(1, abstract)
            jax.block_until_ready(out)
            times[mode].append(time.perf_counter() - t)
            del out
    ckpt.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"save_s": round(save_s, 2), "medians_s": {k: round(v, 3) for k, v in med.items()},
            "ranges_s": {k: [round(min(v), 3), round(max(v), 3)] for k, v in times.items()},
            "ratio": round(med["verify+restore"] / med["restore"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--where", default="local,gcs")
    args = parser.parse_args()
    for where in args.where.split(","):
        if where == "local":
            print("local", _bench(os.path.join(tempfile.mkdtemp(prefix="restore_verify_"), "m"), args.gib, args.repeats), flush=True)
        else:
            from tests.cloud import conftest

            server, url = conftest.start_emulator(os.path.join(tempfile.mkdtemp(), "server.log"))
            os.environ.update({"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
                               "TENSORSTORE_GCS_HTTP_VERSION": "1", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator"})
            try:
                print("gcs", _bench(f"gs://{conftest.BUCKET}/{uuid.uuid4().hex[:8]}", args.gib, args.repeats), flush=True)
            finally:
                server.terminate()
                server.wait(timeout=10)


if __name__ == "__main__":
    main()
