"""Event files written without tensorboardX (summary/event_file.py), read back by TensorBoard's
own reader, and the import they save: scalars alone never load tensorboardX (which loads
google-cloud-storage, grpc and cryptography when installed)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

from tpu_estimator.summary.event_file import EventFile, tensorflow_bins


def test_scalars_histograms_and_images_read_back_by_tensorboard(tmp_path):
    logdir = tmp_path / "a" / "b"  # made when missing
    f = EventFile(str(logdir), ".7.000001")
    f.add_scalar("loss", 0.25, global_step=3)
    f.add_scalar("/bad tag!", 1.5, global_step=-2)  # cleaned as tensorboardX cleans it; int64 step
    f.add_scalar("big/step", -4.0, global_step=2**40)
    f.add_histogram("h", np.arange(100.0), global_step=4)
    f.add_image("img", np.full((4, 5, 3), 0.5), global_step=5)
    f.close()
    assert f.path.startswith(str(logdir) + "/events.out.tfevents.") and f.path.endswith(".7.000001")
    raw = list(RawEventFileLoader(f.path).Load())  # every record's framing and CRCs checked
    assert len(raw) == 6
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    acc.Reload()
    assert acc.file_version == 2.0
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(3, 0.25)]
    assert [(e.step, e.value) for e in acc.Scalars("bad_tag_")] == [(-2, 1.5)]
    assert [(e.step, e.value) for e in acc.Scalars("big/step")] == [(2**40, -4.0)]
    (h,) = acc.Histograms("h")
    assert (h.step, h.histogram_value.num, h.histogram_value.sum) == (4, 100.0, 4950.0)
    assert h.histogram_value.max == 99.0 and sum(h.histogram_value.bucket) == 100
    (img,) = acc.Images("img")
    assert (img.step, img.width, img.height) == (5, 5, 4)


def test_tensorflow_bins_are_tensorboards_default_buckets():
    bins = tensorflow_bins()
    assert bins[len(bins) // 2] == 0 and bins == sorted(bins) and bins == [-b for b in reversed(bins)]
    assert bins[len(bins) // 2 + 1] == 1e-12 and 1e19 < bins[-1] < 1e20 * 1.1


def test_scalar_summaries_never_import_tensorboardx(tmp_path):
    code = (
        "import json, sys\n"
        "import tpu_estimator as te\n"
        f"w = te.summary.create_file_writer({str(tmp_path)!r})\n"
        "w.scalar('loss', 1.0, step=1)\n"
        "w.scalars(2, {'accuracy': 0.5})\n"
        "w.flush()\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert {"tensorboardX", "tensorboard", "grpc", "cryptography", "requests"}.isdisjoint(loaded), loaded
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("accuracy")] == [(2, 0.5)]
