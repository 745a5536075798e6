"""A yolo8 run's args.yaml read by Ultralytics 8.0.232 (run by scripts/peer.sh; ctest -R Peer).

Usage: args_check.py RUN_DIR REPLAY_PROJECT

1. `ultralytics.cfg.get_cfg(RUN_DIR/args.yaml)` takes it (its type and range checks), and the file holds exactly
   the keys of Ultralytics' cfg/default.yaml in their order, then save_dir, as its trainer writes them.
2. Each value equals ours, read from RUN_DIR/yolo8_args.yaml (every yolo8 setting in yolo8's form), where
   yolo8 spells the same meaning differently: 0 / -1 / '' for none (time, conf, line_width, empty text) is null
   there, the run's name is its folder's, format=state_dict (no Ultralytics export) is torchscript.
3. The replay: Ultralytics' DetectionTrainer built from the file, as `YOLO(model).train(cfg=args.yaml)` builds it
   (get_cfg over default.yaml; it drops save_dir and makes its own folder, here under REPLAY_PROJECT), finds the
   dataset and writes its own args.yaml, which must hold our values again (a fixed point), save_dir and name
   aside.

Prints one JSON line; exit 1 if any of that does not hold.
"""
import json
import sys
from pathlib import Path

import yaml
from ultralytics.cfg import get_cfg
from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.utils import DEFAULT_CFG_DICT


def expected_value(key, ours, save_dir):
    """What our setting `key` is in Ultralytics' form (see the docstring, item 2)."""
    value = ours[key]
    if key == "name":
        return Path(save_dir).name
    if key in ("time", "line_width") and value == 0:
        return None
    if key == "conf" and value == -1:
        return None
    if key == "format" and value == "state_dict":
        return "torchscript"
    if key == "batch" and value < 1:
        return -1
    if key == "resume" and value == "auto":
        return False
    if value == "" or value == []:
        return None
    if key == "device" and isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def main() -> int:
    run_dir, replay_project = Path(sys.argv[1]), Path(sys.argv[2])
    failures = []
    path = run_dir / "args.yaml"
    text = yaml.safe_load(path.read_text())
    cfg = vars(get_cfg(str(path)))  # raises on a bad type or range
    keys = list(text)
    wanted_keys = list(DEFAULT_CFG_DICT) + ["save_dir"]
    if keys != wanted_keys:
        failures.append({"keys": {"extra": [k for k in keys if k not in wanted_keys],
                                  "missing": [k for k in wanted_keys if k not in keys]}})

    ours = yaml.safe_load((run_dir / "yolo8_args.yaml").read_text())
    compared = 0
    for key, value in cfg.items():
        if key in ours:
            compared += 1
            want = expected_value(key, ours, cfg["save_dir"])
            if value != want or (type(value) is bool) != (type(want) is bool):
                failures.append({"key": key, "args.yaml": value, "ours": ours[key]})
        elif key != "save_dir" and value != DEFAULT_CFG_DICT[key]:
            failures.append({"key": key, "args.yaml": value, "ultralytics default": DEFAULT_CFG_DICT[key]})
    if Path(cfg["save_dir"]).resolve() != run_dir.resolve():
        failures.append({"save_dir": cfg["save_dir"], "run": str(run_dir)})

    # The replay, as Model.train(cfg=...) does it: the file's keys over default.yaml, mode train.
    overrides = {**text, "mode": "train", "project": str(replay_project), "name": "replay", "exist_ok": True}
    trainer = DetectionTrainer(overrides=overrides)
    replayed = yaml.safe_load((Path(trainer.save_dir) / "args.yaml").read_text())
    for key, value in text.items():
        if key in ("save_dir", "name", "project", "exist_ok"):
            continue
        if replayed.get(key) != value:
            failures.append({"replayed": key, "ours": value, "ultralytics": replayed.get(key)})
    print(json.dumps({"keys": len(keys), "compared": compared, "replay_dataset": trainer.data.get("yaml_file"),
                      "replay_images": trainer.trainset, "failures": failures}, default=str))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
