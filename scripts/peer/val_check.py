"""Ultralytics 8.0.232 `val` on the reference val case, against the figures stored with it (scripts/peer_check.sh
runs this inside scripts/peer.sh). usage: val_check.py CASE_DIR WORK_DIR OUT_JSON

The case is copied to WORK_DIR first: Ultralytics writes a label cache next to the labels, and the case's
data.yaml says `path: .`, which 8.0.232 would take relative to its datasets_dir, so the copy's data.yaml gets the
absolute path. The settings are those the stored figures were computed with (make_val_case.py beside the case):
imgsz 160, batch 16, conf 0.001, iou 0.7, device cpu, workers 0, plots off.
"""
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

case_dir, work, out_json = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
TOLERANCE = float(os.environ.get("YOLO8_PEER_TOLERANCE", "1e-3"))

data_dir = work / "val_case"
shutil.rmtree(data_dir, ignore_errors=True)
shutil.copytree(case_dir, data_dir, ignore=shutil.ignore_patterns("*.cache", "val_case.pt"))
yaml_lines = (data_dir / "data.yaml").read_text().splitlines()
(data_dir / "data.yaml").write_text(
    "\n".join(f"path: {data_dir}" if line.startswith("path:") else line for line in yaml_lines) + "\n")

import torch  # noqa: E402  (after the copy: nothing above needs it)
import ultralytics  # noqa: E402
from ultralytics.models.yolo.detect import DetectionValidator  # noqa: E402

golden = torch.load(case_dir / "val_case.pt", map_location="cpu", weights_only=True)
settings = golden["settings"]
args = dict(model=str(data_dir / "yolov8n-val-case.pt"), data=str(data_dir / "data.yaml"), imgsz=settings["imgsz"],
            batch=settings["batch"], conf=settings["conf"], iou=settings["iou"], max_det=settings["max_det"],
            device="cpu", workers=0, plots=False, split="val", project=str(work / "runs"), name="val", exist_ok=True)
start = time.perf_counter()
validator = DetectionValidator(args=args)
validator()
seconds = time.perf_counter() - start
box = validator.metrics.box
measured = {"precision": float(box.mp), "recall": float(box.mr), "map50": float(box.map50), "map50_95": float(box.map)}
stored = {k: float(golden[k]) for k in measured}
ap_measured = torch.tensor(box.all_ap, dtype=torch.float64)
ap_stored = golden["ap_per_class"].to(torch.float64)
ap_diff = float((ap_measured - ap_stored).abs().max()) if ap_measured.shape == ap_stored.shape else float("inf")
diff = {k: measured[k] - stored[k] for k in measured}
worst = max(max(abs(d) for d in diff.values()), ap_diff)

print(f"\nUltralytics {ultralytics.__version__} val on {case_dir} ({len(list((data_dir / 'images/val').glob('*.jpg')))} images,"
      f" imgsz {settings['imgsz']}, batch {settings['batch']}, conf {settings['conf']}, iou {settings['iou']}),"
      f" torch {torch.__version__}, {torch.get_num_threads()} threads: {seconds:.2f} s")
print(f"{'metric':<16}{'measured':>10}{'stored':>10}{'difference':>13}")
for k in measured:
    print(f"{k:<16}{measured[k]:>10.6f}{stored[k]:>10.6f}{diff[k]:>+13.2e}")
print(f"{'ap_per_class':<16}{'':>20}{ap_diff:>13.2e}  (largest |difference| of {ap_stored.numel()} APs)")
note = None
if worst > TOLERANCE:
    note = (f"differs from the stored figures (torch 1.13.1) by up to {worst:.2e}, beyond {TOLERANCE:g}")
    print("NOTE:", note)

out_json.parent.mkdir(parents=True, exist_ok=True)
out_json.write_text(json.dumps({
    "case": str(case_dir), "ultralytics": ultralytics.__version__, "torch": torch.__version__,
    "numpy": __import__("numpy").__version__, "python": platform.python_version(),
    "threads": torch.get_num_threads(), "settings": settings, "seconds": round(seconds, 3),
    "measured": measured, "stored": stored, "difference": diff, "ap_per_class_max_abs_difference": ap_diff,
    "stored_with": "Ultralytics 8.0.232 on torch 1.13.1 (CPU)", "tolerance": TOLERANCE, "note": note,
}, indent=2) + "\n")
print(f"wrote {out_json}")
