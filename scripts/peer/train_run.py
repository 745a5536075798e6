"""Ultralytics 8.0.232 training through its Python API, as `yolo train` runs it, with timestamps of its first step
for benchmarks/peer_compare.py (run inside scripts/peer.sh).
usage: train_run.py key=value ...   (the keys of `yolo train`; model= defaults to yolov8n.yaml)

Prints `PEER_EVENT NAME UNIX_TIME` lines, flushed: `import_done`, `first_batch_start` (the callback
on_train_batch_start of the first batch: the loader has delivered it), `first_batch_end` (on_train_batch_end: one
forward, loss and backward done, like ours' first progress line), `epoch_end` (on_fit_epoch_end: after validation)
and `train_end`. The caller takes the launch time itself, so the interpreter's own start-up is included.
"""
import sys
import time

args = dict(a.split("=", 1) for a in sys.argv[1:])
model = args.pop("model", "yolov8n.yaml")
for key, value in list(args.items()):
    if value.lower() in ("true", "false"):
        args[key] = value.lower() == "true"
    else:
        try:
            args[key] = int(value)
        except ValueError:
            try:
                args[key] = float(value)
            except ValueError:
                pass

from ultralytics import YOLO  # noqa: E402


def event(name):
    print(f"\nPEER_EVENT {name} {time.time():.6f}", flush=True)  # a line of its own after tqdm's


event("import_done")
seen = set()


def once(name):
    def callback(_trainer):
        if name not in seen:
            seen.add(name)
            event(name)
    return callback


yolo = YOLO(model)
yolo.add_callback("on_train_batch_start", once("first_batch_start"))
yolo.add_callback("on_train_batch_end", once("first_batch_end"))
yolo.add_callback("on_fit_epoch_end", lambda _t: event("epoch_end"))
yolo.add_callback("on_train_end", lambda _t: event("train_end"))
yolo.train(**args)
