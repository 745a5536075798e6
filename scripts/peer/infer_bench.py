"""Ultralytics 8.0.232 validation and prediction throughput for benchmarks/peer_compare.py (inside scripts/peer.sh).
usage: infer_bench.py val MODEL DATA_YAML IMGSZ BATCH WORKERS OUT_JSON
       infer_bench.py predict MODEL SOURCE_DIR IMGSZ OUT_JSON

val: DetectionValidator (conf 0.001, iou 0.7, rect as `yolo val`, plots off), timed from its callback on_val_start to on_val_end: the
loop over the loader (decode + letterbox in its workers), preprocess, forward, NMS and the metrics, after its model
warm-up. Ours (`yolo8 val`) prints the same span as "Speed: X ms per image (loading, inference, NMS)" (no warm-up).
predict: the Python API's predict (batch 1, conf 0.25, save off) streamed over the folder; images/s between the
first and the last image's on_predict_batch_end, so start-up, model load and the first image are left out, as
benchmarks/peer_compare.py does for ours from the time its per-image lines arrive.
"""
import json
import sys
import time

mode = sys.argv[1]
from ultralytics import YOLO  # noqa: E402

if mode == "val":
    model, data, imgsz, batch, workers, out_json = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), \
        int(sys.argv[6]), sys.argv[7]
    from ultralytics.models.yolo.detect import DetectionValidator

    marks = {}
    # rect=True as `yolo val` sets it (YOLO.val's custom args; DetectionValidator's own default is False): batches
    # of one shape, padded to the stride, as ours.
    args = dict(model=model, data=data, imgsz=imgsz, batch=batch, conf=0.001, iou=0.7, device="cpu", workers=workers,
                rect=True, plots=False, split="val", project=str(__import__("pathlib").Path(out_json).parent / "peer_val"),
                name="val", exist_ok=True)
    validator = DetectionValidator(args=args)
    validator.add_callback("on_val_start", lambda _v: marks.setdefault("start", time.perf_counter()))
    validator.add_callback("on_val_end", lambda _v: marks.setdefault("end", time.perf_counter()))
    validator()
    images = len(validator.dataloader.dataset)
    seconds = marks["end"] - marks["start"]
    result = {"side": "ultralytics", "mode": "val", "imgsz": imgsz, "batch": batch, "workers": workers,
              "images": images, "seconds": seconds, "images_per_s": images / seconds,
              "speed_ms": dict(validator.speed), "map50_95": float(validator.metrics.box.map)}
else:
    model, source, imgsz, out_json = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    yolo = YOLO(model)
    stamps = []
    yolo.add_callback("on_predict_batch_end", lambda _p: stamps.append(time.perf_counter()))
    detections = 0
    for r in yolo.predict(source=source, imgsz=imgsz, conf=0.25, iou=0.7, device="cpu", batch=1, save=False,
                          stream=True, verbose=False):
        detections += len(r.boxes)
    images = len(stamps)
    seconds = stamps[-1] - stamps[0]
    result = {"side": "ultralytics", "mode": "predict", "imgsz": imgsz, "batch": 1, "images": images,
              "timed_images": images - 1, "seconds": seconds, "images_per_s": (images - 1) / seconds,
              "detections": detections}
with open(out_json, "w") as f:
    json.dump(result, f, indent=2)
print(f"ultralytics {mode} at {imgsz}: {result['images_per_s']:.2f} images/s")
