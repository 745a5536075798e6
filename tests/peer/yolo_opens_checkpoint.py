"""Our best.pt / last.pt in Ultralytics 8.0.232's YOLO() (run by scripts/peer.sh; ctest -R Peer.UltralyticsOpens).

For each checkpoint: torch.load gives Ultralytics' DetectionModel objects beside our `yolo8` state, the model
YOLO() picks (ema, else model) holds exactly our EMA tensors, and YOLO(path).predict on the images gives the boxes
`yolo8 predict ... save_txt save_conf` wrote: every box matched one to one with IoU >= 0.99, the same class and
confidences within 1e-4 (a box only one side has is allowed when its confidence is within 1e-4 of the threshold).
Also reports what a half-precision model object would cost (half_max_conf_diff), which is why ours stays fp32.
Usage: yolo_opens_checkpoint.py IMAGES IMGSZ CONF WEIGHTS:LABELS_DIR...
Prints one JSON line per checkpoint; exit 1 on any failure.
"""
import json
import sys
from pathlib import Path

import torch
from ultralytics import YOLO

IOU_MIN = 0.99
CONF_TOL = 1e-4


def iou(a, b):
    """IoU of two normalised (cx, cy, w, h) boxes."""
    ax1, ay1, ax2, ay2 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx1, by1, bx2, by2 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    iw, ih = max(0.0, min(ax2, bx2) - max(ax1, bx1)), max(0.0, min(ay2, by2) - max(ay1, by1))
    inter = iw * ih
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def ours(labels_dir, stem):
    path = Path(labels_dir) / f"{stem}.txt"
    rows = []
    if path.exists():
        for line in path.read_text().split("\n"):
            if line.strip():
                v = line.split()
                rows.append((int(v[0]), [float(x) for x in v[1:5]], float(v[5])))
    return rows


def theirs(result):
    b = result.boxes
    return [(int(c), [float(x) for x in xywhn], float(p)) for c, xywhn, p in zip(b.cls, b.xywhn, b.conf)]


def compare(a_rows, b_rows, conf, stats, failures, where):
    """One-to-one matching, best IoU first; fills stats and failures."""
    pairs = sorted(((iou(a[1], b[1]), i, j) for i, a in enumerate(a_rows) for j, b in enumerate(b_rows)
                    if a[0] == b[0]), reverse=True)
    used_a, used_b = set(), set()
    for overlap, i, j in pairs:
        if i in used_a or j in used_b or overlap < IOU_MIN:
            continue
        used_a.add(i)
        used_b.add(j)
        diff = abs(a_rows[i][2] - b_rows[j][2])
        stats["matched"] += 1
        stats["min_iou"] = min(stats["min_iou"], overlap)
        stats["max_conf_diff"] = max(stats["max_conf_diff"], diff)
        if diff > CONF_TOL:
            failures.append(f"{where}: box {i} conf {a_rows[i][2]} vs {b_rows[j][2]}")
    for side, rows, used in (("ours", a_rows, used_a), ("ultralytics", b_rows, used_b)):
        for k, row in enumerate(rows):
            if k not in used and abs(row[2] - conf) > CONF_TOL:
                failures.append(f"{where}: {side} box {k} {row} has no match")


def check(weights, labels_dir, images, imgsz, conf):
    failures = []
    ckpt = torch.load(weights, map_location="cpu")
    for key in ("model", "ema", "epoch", "best_fitness", "optimizer", "train_args", "date", "version", "yolo8"):
        if key not in ckpt:
            failures.append(f"key '{key}' missing")
    picked = ckpt.get("ema") or ckpt["model"]
    if type(picked).__name__ != "DetectionModel":
        failures.append(f"model is a {type(picked).__name__}")
    state = picked.state_dict()
    ema = ckpt["yolo8"]["ema"]
    if set(state) != set(ema):
        failures.append(f"state names differ: {sorted(set(state) ^ set(ema))[:5]}")
    unequal = [k for k in ema if k in state and not torch.equal(state[k], ema[k])]
    if unequal:
        failures.append(f"{len(unequal)} tensors differ from our EMA, first {unequal[0]}")

    files = sorted(str(p) for p in Path(images).iterdir() if p.suffix in (".jpg", ".png"))
    stats = {"weights": Path(weights).name, "images": len(files), "ours": 0, "ultralytics": 0, "matched": 0,
             "min_iou": 1.0, "max_conf_diff": 0.0}
    # One image per call, as `yolo8 predict` letterboxes each with minimal padding: a Python list is one batch to
    # 8.0.232, and images of different shapes in it are padded to the full square.
    model = YOLO(weights)
    results = [model.predict(source=f, imgsz=imgsz, conf=conf, device="cpu", verbose=False)[0] for f in files]
    half_stats = dict(stats)
    half = YOLO(weights)
    with torch.no_grad():
        for p in half.model.parameters():
            p.copy_(p.half().float())  # what fp16 storage (Ultralytics' own .half()) would have left
    half_results = [half.predict(source=f, imgsz=imgsz, conf=conf, device="cpu", verbose=False)[0] for f in files]
    half_failures = []
    for file, result, half_result in zip(files, results, half_results):
        a, b = ours(labels_dir, Path(file).stem), theirs(result)
        stats["ours"] += len(a)
        stats["ultralytics"] += len(b)
        compare(a, b, conf, stats, failures, Path(file).name)
        compare(a, theirs(half_result), conf, half_stats, half_failures, Path(file).name)
    if stats["ours"] == 0:
        failures.append("no boxes to compare (lower conf)")
    stats["half_max_conf_diff"] = half_stats["max_conf_diff"]
    stats["half_unmatched"] = len(half_failures)
    stats["failures"] = failures[:10]
    print(json.dumps(stats))
    return not failures


def main() -> int:
    images, imgsz, conf = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ok = True
    for spec in sys.argv[4:]:
        weights, labels_dir = spec.split(":")
        ok = check(weights, labels_dir, images, imgsz, conf) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
