"""Random detection-metrics cases and what Ultralytics 8.0.232 computes for them (run by scripts/peer.sh).

usage: metrics_parity.py FIRST_SEED COUNT OUT_JSON
       metrics_parity.py --val-case CASE_DIR WORK_DIR OUT_JSON

Each seed gives one case: a few 512x512 images with random labels and detections, built to hit the edges of the
reference's matching and AP: confidences tied within and across images, detections whose IoU with a label is
exactly k/20 (0.50, 0.55, ... 0.95: a box sharing three sides with the label, coordinates on a 0.5 px grid so that
float32 holds every value exactly), near-duplicate labels, one box labelled with two classes, duplicate detections,
images with no labels, no detections or neither, classes only in the labels or only in the detections. Every
coordinate is a multiple of 0.5 and the image size a power of two, so the normalised xywh labels the validator
takes and the pixel boxes it maps them back to are exact: the C++ side gets the same numbers. Exact duplicates of
a label with its class are left out: both loaders drop duplicate label rows before anything is matched, and the
label such a tie goes to is numpy's unstable argsort's choice, not Ultralytics'.

--val-case runs the real validator on a val case folder (tests/fixtures/val_case: its model, data.yaml, imgsz 160,
batch 16, conf 0.001, iou 0.7, as scripts/peer/val_check.py) and writes one case in the same format: each image's
native-space labels and detections exactly as _process_batch received them (recorded by a wrapper that calls the
real method), with the validator's own figures.

The expected values come from the real code, nothing reimplemented: DetectionValidator.update_metrics (box_iou,
_process_batch, match_predictions, the stats it appends), DetectionValidator.get_stats (DetMetrics.process,
ap_per_class, compute_ap, smooth) and, for the max-F1 tp/fp counts that DetMetrics drops, ap_per_class on the
same concatenated stats. tests/trainer/detect/metrics_parity_test.cpp compares ours with the JSON at 1e-6.
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import ultralytics
from ultralytics.models.yolo.detect import DetectionValidator
from ultralytics.utils import metrics as metrics_module
from ultralytics.utils.metrics import ap_per_class

kSize = 512  # image side: a power of two keeps label normalisation exact
kCurveEvery = 50  # cases whose full P/R/F1 curves are written (1000 points per class each)


def half_px(rng, low, high):
    """A coordinate on the 0.5 px grid in [low, high]."""
    return 0.5 * int(rng.integers(int(2 * low), int(2 * high) + 1))


def make_case(seed):
    rng = np.random.default_rng(seed)
    nc = int(rng.integers(1, 6))
    classes = list(range(nc))
    label_classes = [c for c in classes if not (nc > 1 and c == nc - 1 and rng.random() < 0.3)]
    det_classes = [c for c in classes if not (nc > 1 and c == 0 and rng.random() < 0.3)]
    conf_levels = None
    if rng.random() < 0.4:  # few distinct confidences: ties within and across images
        conf_levels = np.float32(rng.choice([0.1, 0.25, 0.5, 0.75, 0.9], size=int(rng.integers(1, 4)), replace=False))
    images = []
    for _ in range(int(rng.integers(1, 7))):
        labels = []
        m = 0 if rng.random() < 0.15 else int(rng.integers(1, 8))
        for _ in range(m):
            w = float(rng.choice([20.0, 40.0, 100.0, half_px(rng, 4, 200)]))
            h = float(rng.choice([20.0, 40.0, half_px(rng, 4, 200)]))
            x1, y1 = half_px(rng, 0, kSize - w), half_px(rng, 0, kSize - h)
            labels.append([float(rng.choice(label_classes)), x1, y1, x1 + w, y1 + h])
            if rng.random() < 0.1:  # a near-duplicate of the same class, or the same box with another class
                twin = list(labels[-1])
                if len(label_classes) > 1 and rng.random() < 0.5:
                    twin[0] = float(rng.choice([c for c in label_classes if c != twin[0]]))
                else:
                    twin[3] = twin[3] + 0.5 if twin[3] < kSize else twin[3] - 0.5
                labels.append(twin)
        dets = []
        if rng.random() >= 0.15:
            for lab in labels:
                for _ in range(int(rng.integers(0, 4))):
                    c, x1, y1, x2, y2 = lab
                    cls = c if rng.random() < 0.85 or len(det_classes) == 1 else float(rng.choice(det_classes))
                    if cls not in det_classes:
                        cls = float(rng.choice(det_classes))
                    w = x2 - x1
                    if rng.random() < 0.4 and (w * 2) % 20 == 0:  # IoU exactly k/20 with this label
                        k = int(rng.integers(9, 21))
                        box = [x1, y1, x1 + w * k / 20, y2]
                    else:
                        jitter = [half_px(rng, -12, 12) for _ in range(4)]
                        box = [x1 + jitter[0], y1 + jitter[1], x2 + jitter[2], y2 + jitter[3]]
                    dets.append(box + [0.0, cls])
            for _ in range(int(rng.integers(0, 4))):  # false positives anywhere
                w, h = half_px(rng, 4, 150), half_px(rng, 4, 150)
                x1, y1 = half_px(rng, 0, kSize - w), half_px(rng, 0, kSize - h)
                dets.append([x1, y1, x1 + w, y1 + h, 0.0, float(rng.choice(det_classes))])
            if dets and rng.random() < 0.2:  # a duplicate detection
                dets.append(list(dets[int(rng.integers(0, len(dets)))]))
        for d in dets:
            d[0], d[2] = sorted((min(max(d[0], 0.0), kSize), min(max(d[2], 0.0), kSize)))
            d[1], d[3] = sorted((min(max(d[1], 0.0), kSize), min(max(d[3], 0.0), kSize)))
            if conf_levels is not None:
                d[4] = float(rng.choice(conf_levels))
            elif rng.random() < 0.2:
                d[4] = round(float(rng.random()), 2)  # some ties among otherwise distinct values
            else:
                d[4] = float(np.float32(rng.random()))
        dets = np.array(dets, dtype=np.float32).reshape(-1, 6)
        dets = dets[np.argsort(-dets[:, 4], kind="stable")]  # NMS hands them over by descending confidence
        images.append((np.array(labels, dtype=np.float32).reshape(-1, 5), dets))
    if not any(len(lab) or len(det) for lab, det in images):
        images[0] = (np.array([[float(label_classes[0]), 10, 10, 50, 50]], dtype=np.float32), images[0][1])
    return nc, images


class StableArgsortNumpy:
    """numpy with a stable argsort, for ultralytics.utils.metrics while ap_per_class runs on tied confidences.

    ap_per_class orders detections with np.argsort(-conf), numpy's default quicksort: on numpy 1.26 with AVX-512 a
    vectorised sort whose order among equal confidences depends on the CPU's instruction set, not on Ultralytics.
    The AP depends on that order (the precision envelope sees the tied TPs and FPs one by one), and so do P, R and
    F1 (np.interp runs from the last point of one tied block to the first of the next). Cases with tied confidences
    therefore also carry the reference's figures with ties kept in input order, the order ours uses; nothing else
    in the reference changes.
    """

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def argsort(a, *args, **kwargs):
        return np.argsort(a, kind="stable")


def reference(nc, images, work, curves, stable_ties=False):
    validator = DetectionValidator(save_dir=Path(work), args=dict(plots=False, save_json=False, save_txt=False))
    validator.data = {}
    validator.init_metrics(type("Model", (), {"names": {i: f"c{i}" for i in range(nc)}})())
    correct = []
    for labels, dets in images:
        xyxy = torch.from_numpy(labels[:, 1:5].copy())
        xywh = torch.stack([(xyxy[:, 0] + xyxy[:, 2]) / 2, (xyxy[:, 1] + xyxy[:, 3]) / 2, xyxy[:, 2] - xyxy[:, 0],
                            xyxy[:, 3] - xyxy[:, 1]], 1) / kSize
        batch = {"batch_idx": torch.zeros(len(labels)), "cls": torch.from_numpy(labels[:, :1].copy()),
                 "bboxes": xywh, "ori_shape": [(kSize, kSize)], "img": torch.zeros(1, 3, kSize, kSize),
                 "ratio_pad": [((1.0, 1.0), (0.0, 0.0))], "im_file": ["x.jpg"]}
        before = len(validator.stats)
        validator.update_metrics([torch.from_numpy(dets.copy())], batch)
        correct.append(validator.stats[-1][0].int().tolist() if len(validator.stats) > before else None)
    saved_np = metrics_module.np
    if stable_ties:
        metrics_module.np = StableArgsortNumpy()
    try:
        validator.get_stats()
    finally:
        metrics_module.np = saved_np
    box = validator.metrics.box
    stats = [torch.cat(x, 0).cpu().numpy() for x in zip(*validator.stats)]
    computed = bool(stats[0].any())
    out = {"correct": correct, "computed": computed,
           "nt_per_class": validator.nt_per_class.tolist(),
           "mp": float(box.mp), "mr": float(box.mr), "map50": float(box.map50), "map": float(box.map),
           "fitness": float(validator.metrics.fitness)}
    if computed:
        if stable_ties:
            metrics_module.np = StableArgsortNumpy()
        try:
            tp, fp = ap_per_class(*stats, names={})[:2]
        finally:
            metrics_module.np = saved_np
        out.update(classes=[int(c) for c in box.ap_class_index], p=box.p.tolist(), r=box.r.tolist(),
                   f1=box.f1.tolist(), ap=box.all_ap.tolist(), tp=tp.tolist(), fp=fp.tolist())
        if curves:
            out.update(p_curve=box.p_curve.tolist(), r_curve=box.r_curve.tolist(), f1_curve=box.f1_curve.tolist())
    return out


def val_case_figures(validator, correct, stable_ties=False):
    """The validator's figures from its own stats (recomputed: get_stats may run again), numpy's argsort as given."""
    saved_np = metrics_module.np
    if stable_ties:
        metrics_module.np = StableArgsortNumpy()
    try:
        validator.get_stats()
        stats = [torch.cat(x, 0).cpu().numpy() for x in zip(*validator.stats)]
        tp, fp = ap_per_class(*stats, names={})[:2]
    finally:
        metrics_module.np = saved_np
    box = validator.metrics.box
    return {"correct": correct, "computed": True, "nt_per_class": validator.nt_per_class.tolist(), "mp": float(box.mp),
            "mr": float(box.mr), "map50": float(box.map50), "map": float(box.map),
            "fitness": float(validator.metrics.fitness), "classes": [int(c) for c in box.ap_class_index],
            "p": box.p.tolist(), "r": box.r.tolist(), "f1": box.f1.tolist(), "ap": box.all_ap.tolist(),
            "tp": tp.tolist(), "fp": fp.tolist()}


def val_case(case_dir, work, out_json):
    data_dir = work / "val_case"
    shutil.rmtree(data_dir, ignore_errors=True)
    shutil.copytree(case_dir, data_dir, ignore=shutil.ignore_patterns("*.cache", "val_case.pt"))
    lines = (data_dir / "data.yaml").read_text().splitlines()  # 8.0.232 reads `path: .` against datasets_dir
    (data_dir / "data.yaml").write_text(
        "\n".join(f"path: {data_dir}" if line.startswith("path:") else line for line in lines) + "\n")
    seen = []
    process_batch = DetectionValidator._process_batch

    def recording(self, detections, labels):
        correct = process_batch(self, detections, labels)
        seen.append({"labels": labels.tolist(), "detections": detections.tolist(), "correct": correct.int().tolist()})
        return correct

    DetectionValidator._process_batch = recording
    args = dict(model=str(data_dir / "yolov8n-val-case.pt"), data=str(data_dir / "data.yaml"), imgsz=160, batch=16,
                conf=0.001, iou=0.7, max_det=300, device="cpu", workers=0, plots=False, split="val",
                project=str(work / "runs"), name="val", exist_ok=True)
    validator = DetectionValidator(args=args)
    validator()
    DetectionValidator._process_batch = process_batch
    # Every image of the case has labels and detections, so each one went through _process_batch.
    assert len(seen) == validator.seen, (len(seen), validator.seen)
    correct = [image.pop("correct") for image in seen]
    case = {"seed": -1, "nc": len(validator.names), "images": seen,
            "expected": val_case_figures(validator, correct)}
    conf = np.concatenate([np.array(image["detections"], dtype=np.float32).reshape(-1, 6)[:, 4] for image in seen])
    if len(np.unique(conf)) < len(conf):
        # Tied confidences (this CPU's float sums made some equal): the reference's AP follows numpy's sort, so the
        # case also carries its figures with ties in input order, as the random cases do (StableArgsortNumpy).
        case["expected_stable_ties"] = val_case_figures(validator, correct, stable_ties=True)
    doc = {"generator": "scripts/peer/metrics_parity.py --val-case", "ultralytics": ultralytics.__version__,
           "cases": [case]}
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    figures = case["expected"]
    print(f"val case: {len(seen)} images, mAP50 {figures['map50']:.9f}, mAP50-95 {figures['map']:.9f}, "
          f"{len(conf) - len(np.unique(conf))} tied confidences -> {out_json}")


def main():
    if sys.argv[1] == "--val-case":
        val_case(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
        return
    first, count, out_json = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    cases = []
    with tempfile.TemporaryDirectory() as work:
        for seed in range(first, first + count):
            nc, images = make_case(seed)
            case = {"seed": seed, "nc": nc,
                    "images": [{"labels": lab.tolist(), "detections": det.tolist()} for lab, det in images],
                    "expected": reference(nc, images, work, seed % kCurveEvery == 0)}
            conf = np.concatenate([det[:, 4] for _, det in images])
            if len(np.unique(conf)) < len(conf):
                case["expected_stable_ties"] = reference(nc, images, work, seed % kCurveEvery == 0, True)
            cases.append(case)
    doc = {"generator": "scripts/peer/metrics_parity.py", "ultralytics": ultralytics.__version__,
           "numpy": np.__version__, "torch": torch.__version__, "first_seed": first, "cases": cases}
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    tied = [c for c in cases if "expected_stable_ties" in c]
    moved = sum(c["expected"]["map"] != c["expected_stable_ties"]["map"] for c in tied)
    print(f"{len(cases)} cases, {sum(c['expected']['computed'] for c in cases)} with metrics, {len(tied)} with tied"
          f" confidences (numpy's own order moves mAP50-95 in {moved}) -> {out_json}")


if __name__ == "__main__":
    main()
