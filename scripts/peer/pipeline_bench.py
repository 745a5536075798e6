"""Ultralytics 8.0.232's training data pipeline, timed as build/benchmarks/data_pipeline_bench times ours: augmented
training images per CPU-second and per wall second, on a set made by `yolo8 data synth` (benchmarks/peer_compare.py
makes it and gives both sides the same folder). Run inside scripts/peer.sh.
usage: pipeline_bench.py DATA_YAML IMGSZ WORKERS EPOCHS OUT_JSON

Its own dataset and loader with its default train settings (get_cfg(): mosaic 1.0, HSV, fliplr 0.5, translate 0.1,
scale 0.5, augment=True, rect False; build_yolo_dataset(mode='train') and build_dataloader, batch 16):
- WORKERS 0: "one worker": __getitem__ and collate_fn in this process, torch on one thread as ours;
- WORKERS N: Ultralytics' InfiniteDataLoader with N worker processes, as training uses it (workers kept across
  epochs). CPU time = this process (time.process_time) + each worker's utime+stime read from /proc/PID/stat at the
  start and the end of the timed epochs, so prefetching shifts work in and out of the window about equally.
One warm-up epoch (label cache, page cache, worker start) is not timed, as in ours. With workers, up to
2 x WORKERS batches are prefetched at either end of the window: give it many more batches than that.
"""
import json
import os
import sys
import time

data_yaml, imgsz, workers, epochs, out_json = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

import torch  # noqa: E402
from ultralytics.cfg import get_cfg  # noqa: E402
from ultralytics.data import build_dataloader, build_yolo_dataset  # noqa: E402
from ultralytics.data.utils import check_det_dataset  # noqa: E402
from ultralytics.utils import DEFAULT_CFG  # noqa: E402

torch.set_num_threads(1)  # ours: torch::set_num_threads(1); the loader's workers are the only parallelism
BATCH = 16
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    """utime + stime of a live process, in seconds (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


cfg = get_cfg(DEFAULT_CFG)
cfg.imgsz = imgsz
data = check_det_dataset(data_yaml)
dataset = build_yolo_dataset(cfg, data["train"], BATCH, data, mode="train", rect=False, stride=32)
n = len(dataset)

if workers == 0:
    def one_epoch():
        order = torch.randperm(n).tolist()
        images = 0
        for start in range(0, n, BATCH):
            batch = dataset.collate_fn([dataset[i] for i in order[start:start + BATCH]])
            images += batch["img"].shape[0]
        return images

    one_epoch()  # warm-up
    wall0, cpu0 = time.perf_counter(), time.process_time()
    images = sum(one_epoch() for _ in range(epochs))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    used_workers = 0
    worker_cpu = 0.0
else:
    loader = build_dataloader(dataset, BATCH, workers, shuffle=True, rank=-1)
    used_workers = loader.num_workers
    for _ in loader:  # warm-up epoch: starts the workers
        pass
    pids = [w.pid for w in loader.iterator._workers]
    w0 = sum(proc_cpu(p) for p in pids)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    images = 0
    for _ in range(epochs):
        for batch in loader:
            images += batch["img"].shape[0]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    worker_cpu = sum(proc_cpu(p) for p in pids) - w0
    cpu += worker_cpu

result = {"side": "ultralytics", "imgsz": imgsz, "workers": used_workers, "epochs": epochs, "images": images,
          "dataset_images": n, "wall_s": wall, "cpu_s": cpu, "worker_cpu_s": worker_cpu,
          "images_per_s": images / wall, "images_per_cpu_second": images / cpu,
          "hyp": {k: getattr(cfg, k) for k in ("mosaic", "mixup", "copy_paste", "hsv_h", "hsv_s", "hsv_v", "degrees",
                                               "translate", "scale", "shear", "perspective", "flipud", "fliplr")}}
with open(out_json, "w") as f:
    json.dump(result, f, indent=2)
print(f"ultralytics pipeline imgsz {imgsz} workers {used_workers}: {images} images, {images / wall:.1f} images/s, "
      f"{images / cpu:.1f} per CPU-second")
