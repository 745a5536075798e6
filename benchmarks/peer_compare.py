"""yolo8 beside Ultralytics 8.0.232 (the peer), in one run on this machine with the same compute threads: the
four workloads. benchmarks/peer_compare.sh runs this with the system python3 (standard library only); the peer runs
through scripts/peer.sh (scripts/peer/{pipeline_bench,train_run,infer_bench}.py), ours through build/ binaries.

Prints one table (workload | Ultralytics | yolo8 | ratio), writes benchmarks/results/peer_compare.json and rewrites
the README's table between the markers README_BEGIN and README_END. A ratio is "times yolo8 is ahead" (throughput:
ours / peer; times: peer / ours) and is only given when both sides were measured in this run.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README_BEGIN = "<!-- peer_compare:begin (benchmarks/peer_compare.sh rewrites this table) -->"
README_END = "<!-- peer_compare:end -->"
VAL_CASE_REL = "reference/ultralytics-8.0.232/val_case"

FULL = dict(pipe_images=160, pipe_epochs=2, pipe_repeats=2, e2e_train=256, e2e_val=64, infer_copies=4,
            infer_repeats=3, startup_repeats=5)
QUICK = dict(pipe_images=64, pipe_epochs=2, pipe_repeats=1, e2e_train=64, e2e_val=16, infer_copies=1,
             infer_repeats=1, startup_repeats=2)
QUICK_EPOCHS = 2


# ---------------------------------------------------------------------------------------------- pure functions
def splice_readme(text, table):
    """The README with everything between the two markers replaced by `table`; ValueError when the markers are
    missing, repeated or out of order (the README is then left as it is)."""
    if text.count(README_BEGIN) != 1 or text.count(README_END) != 1:
        raise ValueError("README needs exactly one of each marker: %r, %r" % (README_BEGIN, README_END))
    begin = text.index(README_BEGIN) + len(README_BEGIN)
    end = text.index(README_END)
    if end < begin:
        raise ValueError("README's end marker comes before its begin marker")
    return text[:begin] + "\n" + table.strip("\n") + "\n" + text[end:]


def ratio(ours, peer, higher_is_better):
    """Times yolo8 is ahead, or None when either side is missing or zero."""
    if ours is None or peer is None or ours <= 0 or peer <= 0:
        return None
    return ours / peer if higher_is_better else peer / ours


def spread(values):
    """mean, min, max of a list (None for an empty one)."""
    if not values:
        return None
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def accuracy_verdict(ours, peer):
    """How two seed-sets of final mAP50-95 compare: do their min-max ranges overlap, and do the means differ by less
    than the larger spread (max - min) of the two sides?"""
    if not ours or not peer:
        return None
    overlap = ours["min"] <= peer["max"] and peer["min"] <= ours["max"]
    diff = ours["mean"] - peer["mean"]
    widest = max(ours["max"] - ours["min"], peer["max"] - peer["min"])
    return {"ranges_overlap": overlap, "mean_difference": diff, "largest_spread": widest,
            "within_spread": abs(diff) <= widest}


def parse_results_csv(path):
    """The last row of a results.csv (ours or Ultralytics'), keys and values stripped."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = [h.strip() for h in rows[0]]
    return dict(zip(header, (c.strip() for c in rows[-1])))


def fmt(value, digits=1):
    if value is None:
        return "not measured"
    if isinstance(value, str):
        return value
    return f"{value:,.{digits}f}"


def fmt_spread(s, digits=1, unit=""):
    if not s:
        return "not measured"
    if s["n"] == 1:
        return f"{s['mean']:.{digits}f}{unit}"
    return f"{s['mean']:.{digits}f}{unit} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def fmt_ratio(r):
    return f"{r:.2f}×" if r is not None else "—"


def table_rows(res):
    """(workload, Ultralytics, yolo8, ratio) rows from the results dict."""
    rows = []
    peer = res["peer"]["available"]
    for p in res.get("pipeline", {}).get("rows", []):
        label = (f"data pipeline {p['imgsz']} px, {p['label']}: augmented images per CPU-second "
                 f"(images/s wall)")
        o, u = p.get("ours"), p.get("ultralytics")
        rows.append((label,
                     f"{fmt(u['images_per_cpu_second'])} ({fmt(u['images_per_s'])})" if u else "not measured",
                     f"{fmt(o['images_per_cpu_second'])} ({fmt(o['images_per_s'])})" if o else "not measured",
                     fmt_ratio(p.get("ratio"))))
    e = res.get("end_to_end")
    if e:
        desc = (f"end to end: yolov8n from scratch, {e['imgsz']} px, batch 16, {e['epochs']} epochs with validation, "
                f"{e['train']}+{e['val']} images, {e['seeds']} seeds: wall s launch→exit, mean (min–max)")
        rows.append((desc, fmt_spread(e["ultralytics"]["wall_s"]), fmt_spread(e["ours"]["wall_s"]),
                     fmt_ratio(e.get("wall_ratio"))))
        if e["ours"].get("cpu_s"):
            rows.append(("end to end: CPU s of all its processes (user + system), mean (min–max)",
                         fmt_spread(e["ultralytics"].get("cpu_s")), fmt_spread(e["ours"]["cpu_s"]),
                         fmt_ratio(e.get("cpu_ratio"))))
        v = e.get("accuracy")
        verdict = "—"
        if v:
            verdict = ("ranges overlap" if v["ranges_overlap"] else "ranges apart") + \
                f"; means differ {v['mean_difference']:+.3f}, spread {v['largest_spread']:.3f}"
        rows.append(("end to end: final mAP50-95 (last results.csv row), mean (min–max)",
                     fmt_spread(e["ultralytics"]["map50_95"], 3), fmt_spread(e["ours"]["map50_95"], 3), verdict))
    for key, label in (("val", "val"), ("predict", "predict")):
        i = res.get("inference", {}).get(key)
        if i:
            same = ""
            if key == "val" and None not in i["map50_95"].values():
                same = (f"; mAP50-95 Ultralytics {i['map50_95']['ultralytics']:.6f}, yolo8 "
                        f"{i['map50_95']['ours']:.6f}")
            rows.append((f"{label} at {i['imgsz']} px, batch {i['batch']}, {i['images']} images: images/s "
                         f"(best of {i['repeats']}; {i['span']}{same})",
                         fmt(i["ultralytics"], 2), fmt(i["ours"], 2), fmt_ratio(i.get("ratio"))))
    s = res.get("startup")
    if s:
        rows.append((f"start-up: launch → end of the first training step, s (median of {s['repeats']})",
                     fmt(s["ultralytics"], 2), fmt(s["ours"], 2), fmt_ratio(s.get("ratio"))))
    if not peer:
        rows = [(w, "peer not found" if u else "", o, "—" if r else "") for w, u, o, r in rows]
    return rows


def render_table(res):
    rows = table_rows(res)
    m = res["machine"]
    head = (f"{res['date']}, {m['cpu']}, {m['cores']} cores, {res['threads']} compute threads both sides, "
            f"OpenMP waiting {m.get('openmp_wait', '-')} both sides, mode {res['mode']}; "
            f"yolo8 {res['versions']['yolo8']['yolo8']} (LibTorch "
            f"{res['versions']['yolo8']['libtorch']}, OpenCV {res['versions']['yolo8']['opencv']}) vs Ultralytics "
            f"{res['versions']['ultralytics'].get('ultralytics', '-')} (torch "
            f"{res['versions']['ultralytics'].get('torch', '-')}, OpenCV "
            f"{res['versions']['ultralytics'].get('opencv', '-')}). Ratio: times yolo8 is ahead.")
    lines = [head, "", "| workload | Ultralytics | yolo8 | ratio |", "| --- | --- | --- | --- |"]
    lines += [f"| {w} | {u} | {o} | {r} |" for w, u, o, r in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- measurement
class Runner:
    def __init__(self, args):
        self.quick = args.quick
        self.cfg = dict(QUICK if args.quick else FULL)
        self.epochs = int(os.environ.get("EPOCHS", QUICK_EPOCHS if args.quick else 40))
        self.seeds = int(os.environ.get("SEEDS", 2))
        self.build = Path(os.environ.get("BUILD_DIR", REPO / "build"))
        self.yolo8 = self.build / "trainer" / "yolo8"
        self.work = Path(args.work or tempfile.mkdtemp(prefix="yolo8-peer-compare."))
        self.keep = bool(args.work) or args.keep
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = open(self.work / "peer_compare.log", "w")
        self.threads = int(os.environ.get("YOLO8_THREADS") or subprocess.check_output(
            [sys.executable, str(REPO / "scripts/peer/cpu_share.py")], text=True).strip())
        self.peer_reason = "--no-peer given" if args.no_peer else self.find_peer()
        self.peer = self.peer_reason is None

    def say(self, text):
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def find_peer(self):
        """None when the peer is usable, else why not. Never installs: scripts/pyenv.sh peer does that."""
        env = REPO / ".venv" / "peer"
        if not (env / "bin" / "python").exists():
            return f"{env} missing (scripts/pyenv.sh peer installs it)"
        stamp, lock = env / ".yolo8-installed-lock.txt", REPO / "scripts/locks/peer.txt"
        if not stamp.exists() or stamp.read_bytes() != lock.read_bytes():
            return f"{env} is not installed from {lock} (scripts/pyenv.sh peer refreshes it)"
        probe = subprocess.run([str(REPO / "scripts/peer.sh"), "python", "-c", "import ultralytics"],
                               capture_output=True, text=True, env=self.env())
        if probe.returncode != 0:
            return "import ultralytics failed: " + probe.stderr.strip().splitlines()[-1]
        return None

    def env(self):
        # OMP_WAIT_POLICY / GOMP_SPINCOUNT of the caller reach both sides alike (unset: libgomp's default for both).
        env = dict(os.environ)
        env["YOLO8_THREADS"] = str(self.threads) if hasattr(self, "threads") else env.get("YOLO8_THREADS", "")
        if not env["YOLO8_THREADS"]:
            env.pop("YOLO8_THREADS")
        env.setdefault("YOLO_CONFIG_DIR", str(self.work / "peer_config"))
        return env

    def run(self, cmd, name, env=None, stop_on=None, cwd=None):
        """Runs cmd, timestamps each output line as it arrives (perf_counter and time.time()), saves the log.
        stop_on: a regex; the process is killed at its first matching line (start-up runs). Returns a dict."""
        cmd = [str(c) for c in cmd]
        self.log.write(f"$ {' '.join(cmd)}\n")
        self.log.flush()
        launch, launch_unix = time.perf_counter(), time.time()
        before = os.times()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env or self.env(),
                                cwd=cwd or REPO, start_new_session=True)
        lines, stopped = [], False
        with open(self.work / f"{name}.log", "w") as out:
            for raw in iter(proc.stdout.readline, b""):
                now = time.perf_counter()
                text = raw.decode(errors="replace").rstrip("\r\n")
                lines.append((now - launch, text))
                out.write(f"{now - launch:9.3f} {text}\n")
                if stop_on and not stopped and re.search(stop_on, text):
                    stopped = True
                    os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
        wall = time.perf_counter() - launch
        after = os.times()
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        if rc != 0 and not stopped:
            tail = "\n".join(t for _, t in lines[-15:])
            raise RuntimeError(f"{name} failed (exit {rc}):\n{tail}\n(log: {self.work / (name + '.log')})")
        return {"wall_s": wall, "cpu_s": cpu, "lines": lines, "launch_unix": launch_unix, "stopped": stopped}

    def peer_cmd(self, *args):
        return [REPO / "scripts/peer.sh", "python", *args]

    def synth(self, out, train, val, imgsz):
        if not (Path(out) / "data.yaml").exists():
            subprocess.run([self.yolo8, "data", "synth", f"out={out}", f"train={train}", f"val={val}",
                            f"imgsz={imgsz}", "seed=0"], check=True, stdout=subprocess.DEVNULL)
        return Path(out) / "data.yaml"

    def ours_threads_args(self):
        return [f"threads={self.threads}"]

    # 1. data pipeline
    def pipeline(self):
        c = self.cfg
        root = self.work / "pipe"
        for imgsz in (640, 320):
            self.synth(root / f"s{imgsz}", c["pipe_images"], 1, imgsz)
        ours_runs, peer_runs = [], {}
        for rep in range(c["pipe_repeats"]):
            self.say(f"[1/4] data pipeline, repeat {rep + 1}/{c['pipe_repeats']}: yolo8")
            out = self.work / f"ours_pipe_{rep}.json"
            self.run([self.build / "benchmarks/data_pipeline_bench", "--dir", root, "--images", c["pipe_images"],
                      "--epochs", c["pipe_epochs"], "--json", out], f"ours_pipe_{rep}")
            ours_runs.append(json.loads(out.read_text()))
            if not self.peer:
                continue
            for imgsz in (640, 320):
                for workers in (0, self.threads):
                    self.say(f"[1/4] data pipeline, repeat {rep + 1}: Ultralytics {imgsz} px, "
                             f"{'in-process' if workers == 0 else f'{workers} worker processes'}")
                    out = self.work / f"peer_pipe_{imgsz}_{workers}_{rep}.json"
                    self.run(self.peer_cmd(REPO / "scripts/peer/pipeline_bench.py", root / f"s{imgsz}/data.yaml",
                                           imgsz, workers, c["pipe_epochs"], out), out.stem)
                    peer_runs.setdefault((imgsz, workers), []).append(json.loads(out.read_text()))
        rows = []
        for imgsz in (640, 320):
            for label, peer_workers, ours_workers in (("one worker", 0, 1),
                                                      (f"all workers ({self.threads})", self.threads, self.threads)):
                ours = [r for run in ours_runs for r in run["results"]
                        if r["imgsz"] == imgsz and r["workers"] == ours_workers]
                best_ours = max(ours, key=lambda r: r["images_per_cpu_second"]) if ours else None
                peers = peer_runs.get((imgsz, peer_workers), [])
                best_peer = max(peers, key=lambda r: r["images_per_cpu_second"]) if peers else None
                note = None
                if best_peer and peer_workers and best_peer["workers"] != peer_workers:
                    note = f"Ultralytics capped its workers at {best_peer['workers']}"
                rows.append({"imgsz": imgsz, "label": label, "ours": best_ours, "ultralytics": best_peer,
                             "ours_all": ours, "ultralytics_all": peers, "note": note,
                             "ratio": ratio(best_ours and best_ours["images_per_cpu_second"],
                                            best_peer and best_peer["images_per_cpu_second"], True)
                             if note is None else None})
        missing = [r for r in rows if r["ours"] is None]
        return {"images": c["pipe_images"], "epochs_timed": c["pipe_epochs"], "repeats": c["pipe_repeats"],
                "set": f"yolo8 data synth train={c['pipe_images']} val=1 imgsz=SIZE seed=0 (the same folder both sides)",
                "best_of_repeats": "highest images per CPU-second", "rows": rows,
                "ours_stage_profile_ms": ours_runs[-1].get("stages_ms") if ours_runs else None,
                "note": ("data_pipeline_bench times 1 and 2 workers only: no 'all workers' figure of ours for "
                         f"{self.threads} threads") if missing else None}

    # 2. end to end
    def end_to_end(self):
        c = self.cfg
        data = self.synth(self.work / "e2e/ds", c["e2e_train"], c["e2e_val"], 160)
        sides = {"ours": {"wall_s": [], "map50_95": [], "runs": []},
                 "ultralytics": {"wall_s": [], "map50_95": [], "runs": []}}
        common = dict(data=data, imgsz=160, epochs=self.epochs, batch=16, workers=self.threads)
        for seed in range(self.seeds):
            self.say(f"[2/4] end to end, seed {seed}: yolo8 ({self.epochs} epochs)")
            project = self.work / "e2e/ours"
            r = self.run(["stdbuf", "-oL", self.yolo8, "train", "model=yolov8n.yaml",
                          *(f"{k}={v}" for k, v in common.items()),
                          f"seed={seed}", "quota=off", "plots=false", f"project={project}", f"name=s{seed}",
                          "exist_ok=true", *self.ours_threads_args()], f"ours_train_s{seed}")
            last = parse_results_csv(project / f"s{seed}/results.csv")
            self.record_train(sides["ours"], r, last, seed)
            if not self.peer:
                continue
            self.say(f"[2/4] end to end, seed {seed}: Ultralytics ({self.epochs} epochs)")
            project = self.work / "e2e/peer"
            r = self.run(self.peer_cmd(REPO / "scripts/peer/train_run.py", "model=yolov8n.yaml",
                                       *(f"{k}={v}" for k, v in common.items()), f"seed={seed}", "device=cpu",
                                       "plots=False", f"project={project}", f"name=s{seed}", "exist_ok=True"),
                         f"peer_train_s{seed}")
            last = parse_results_csv(project / f"s{seed}/results.csv")
            self.record_train(sides["ultralytics"], r, last, seed)
        out = {"imgsz": 160, "batch": 16, "epochs": self.epochs, "seeds": self.seeds, "train": c["e2e_train"],
               "val": c["e2e_val"], "workers": self.threads, "order": "interleaved: ours s0, peer s0, ours s1, ...",
               "set": f"yolo8 data synth train={c['e2e_train']} val={c['e2e_val']} imgsz=160 seed=0"}
        for side, d in sides.items():
            out[side] = {"wall_s": spread(d["wall_s"]), "map50_95": spread(d["map50_95"]),
                         "cpu_s": spread([r["cpu_s"] for r in d["runs"]]), "runs": d["runs"]}
        if self.peer:
            out["wall_ratio"] = ratio(out["ours"]["wall_s"]["mean"], out["ultralytics"]["wall_s"]["mean"], False)
            out["cpu_ratio"] = ratio(out["ours"]["cpu_s"]["mean"], out["ultralytics"]["cpu_s"]["mean"], False)
            out["accuracy"] = accuracy_verdict(out["ours"]["map50_95"], out["ultralytics"]["map50_95"])
        return out

    def record_train(self, side, r, last, seed):
        text = [t for _, t in r["lines"]]
        optimizer = next((re.sub(r"\x1b\[[0-9;]*m", "", t) for t in text if "optimizer:" in t and "(lr=" in t), None)
        first = self.first_step(r)
        side["wall_s"].append(r["wall_s"])
        side["map50_95"].append(float(last["metrics/mAP50-95(B)"]))
        side["runs"].append({"seed": seed, "wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "first_step_s": first,
                             "map50_95": float(last["metrics/mAP50-95(B)"]), "map50": float(last["metrics/mAP50(B)"]),
                             "epochs": int(float(last["epoch"])), "optimizer_line": optimizer,
                             # ours does not print its optimizer: the last lr of each group shows whether both
                             # picked the same (Ultralytics' optimizer=auto rule, trainer/core/optimizer.cpp)
                             "last_lr": {k: float(last[k]) for k in ("lr/pg0", "lr/pg1", "lr/pg2") if k in last}})

    @staticmethod
    def first_step(r):
        """Seconds from launch to the end of the first training step: ours' first progress line of epoch 1 (printed
        after its step 1 when an epoch has at most 10 steps), the peer's on_train_batch_end event."""
        for t, text in r["lines"]:
            m = re.search(r"PEER_EVENT first_batch_end (\d+\.\d+)", text)
            if m:
                return float(m.group(1)) - r["launch_unix"]
            if re.match(r"^1/\d+ .* 1/\d+ \[", text):
                return t
        return None

    # 3. val and predict
    def inference(self):
        c = self.cfg
        case = Path(os.environ.get("YOLO8_SHARED", REPO.parent / "shared")) / VAL_CASE_REL
        if not (case / "data.yaml").exists():
            self.say(f"[3/4] skipped: no val case at {case} (set YOLO8_SHARED)")
            return {"skipped": f"no val case at {case}"}
        root = self.work / "infer"
        for sub in ("images/val", "labels/val"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        for copy in range(c["infer_copies"]):
            for img in sorted((case / "images/val").glob("*.jpg")):
                shutil.copy(img, root / "images/val" / f"{img.stem}_{copy}.jpg")
                label = case / "labels/val" / f"{img.stem}.txt"
                if label.exists():
                    shutil.copy(label, root / "labels/val" / f"{img.stem}_{copy}.txt")
        names = re.search(r"^names:.*", (case / "data.yaml").read_text(), re.S | re.M).group(0)
        (root / "data.yaml").write_text(f"path: {root}\ntrain: images/val\nval: images/val\n{names}")
        model = case / "yolov8n-val-case.pt"
        n = len(list((root / "images/val").glob("*.jpg")))
        val = {"ours": [], "ultralytics": [], "ours_map": None, "ultralytics_map": None}
        pred = {"ours": [], "ultralytics": []}
        for rep in range(c["infer_repeats"]):
            self.say(f"[3/4] val and predict at 640, repeat {rep + 1}/{c['infer_repeats']}")
            r = self.run([self.yolo8, "val", f"model={model}", f"data={root / 'data.yaml'}", "imgsz=640", "batch=16",
                          f"workers={self.threads}", "plots=false", f"project={self.work / 'infer_runs'}",
                          "name=val", "exist_ok=true", *self.ours_threads_args()], f"ours_val_{rep}")
            text = [t for _, t in r["lines"]]
            # Parsed from yolo8 val's output: a changed line leaves the figure out (said so), it does not stop the run.
            ms = next((float(m.group(1)) for t in text if (m := re.match(r"Speed: ([\d.]+) ms per image", t))), None)
            if ms:
                val["ours"].append(1000.0 / ms)
            else:
                self.say("  yolo8 val printed no 'Speed: X ms per image' line: no val figure of ours")
            val["ours_map"] = next((float(t.split()[-1]) for t in text if t.split()[:1] == ["all"]), None)
            r = self.run(["stdbuf", "-oL", self.yolo8, "predict", f"model={model}", f"source={root / 'images/val'}",
                          "imgsz=640", "conf=0.25", "save=false", f"project={self.work / 'infer_runs'}",
                          "name=predict", "exist_ok=true", *self.ours_threads_args()], f"ours_predict_{rep}")
            stamps = [t for t, text in r["lines"] if re.search(r": \d+x\d+ \d+ detections$", text)]
            if len(stamps) >= 2 and stamps[-1] > stamps[0]:
                pred["ours"].append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
            else:
                self.say("  yolo8 predict printed no per-image lines ('FILE: HxW N detections'): no predict figure")
            if not self.peer:
                continue
            out = self.work / f"peer_val_{rep}.json"
            self.run(self.peer_cmd(REPO / "scripts/peer/infer_bench.py", "val", model, root / "data.yaml", 640, 16,
                                   self.threads, out), out.stem)
            j = json.loads(out.read_text())
            val["ultralytics"].append(j["images_per_s"])
            val["ultralytics_map"] = j["map50_95"]
            out = self.work / f"peer_predict_{rep}.json"
            self.run(self.peer_cmd(REPO / "scripts/peer/infer_bench.py", "predict", model, root / "images/val", 640,
                                   out), out.stem)
            pred["ultralytics"].append(json.loads(out.read_text())["images_per_s"])
        res = {}
        for key, d, batch, span in (
                ("val", val, 16, "loader + forward + NMS + metrics, model load and start-up excluded"),
                ("predict", pred, 1, "first to last image, start-up and model load excluded")):
            o = max(d["ours"]) if d["ours"] else None
            u = max(d["ultralytics"]) if d["ultralytics"] else None
            res[key] = {"imgsz": 640, "batch": batch, "images": n, "repeats": c["infer_repeats"], "span": span,
                        "ours": o, "ultralytics": u, "ours_all": d["ours"], "ultralytics_all": d["ultralytics"],
                        "ratio": ratio(o, u, True)}
        res["val"]["map50_95"] = {"ours": val["ours_map"], "ultralytics": val["ultralytics_map"]}
        res["weights"] = f"{model} (an Ultralytics 8.0.232 file; yolo8 reads it natively)"
        res["images"] = f"the {n // c['infer_copies']} photos of {case}/images/val × {c['infer_copies']}"
        return res

    # 4. start-up
    def startup(self):
        c = self.cfg
        data = self.synth(self.work / "startup/ds", 64, 16, 160)  # 4 steps an epoch: step 1 prints a line
        first_line = r"^1/1 .* 1/4 \["
        runs = {"ours": [], "ultralytics": []}
        args = ["model=yolov8n.yaml", f"data={data}", "imgsz=160", "epochs=1", "batch=16", f"workers={self.threads}"]
        for rep in range(c["startup_repeats"]):
            self.say(f"[4/4] start-up, repeat {rep + 1}/{c['startup_repeats']}")
            r = self.run(["stdbuf", "-oL", self.yolo8, "train", *args, "quota=off", "plots=false",
                          f"project={self.work / 'startup/ours'}", f"name=r{rep}", *self.ours_threads_args()],
                         f"startup_ours_{rep}", stop_on=first_line)
            runs["ours"].append(self.first_step(r))
            if self.peer:
                r = self.run(self.peer_cmd(REPO / "scripts/peer/train_run.py", *args, "device=cpu", "plots=False",
                                           f"project={self.work / 'startup/peer'}", f"name=r{rep}"),
                             f"startup_peer_{rep}", stop_on=r"PEER_EVENT first_batch_end ")
                runs["ultralytics"].append(self.first_step(r))
        med = {k: statistics.median(v) if v and None not in v else None for k, v in runs.items()}
        return {"repeats": c["startup_repeats"], "set": "yolo8 data synth train=64 val=16 imgsz=160 seed=0",
                "span": "launch to the end of the first training step (ours: its first progress line, read "
                        "line-buffered through stdbuf; Ultralytics: on_train_batch_end, both timed by this script)",
                "ours": med["ours"], "ultralytics": med["ultralytics"],
                "ratio": ratio(med["ours"], med["ultralytics"], False), "runs": runs}

    def versions(self):
        v = {"yolo8": {}, "ultralytics": {}}
        text = subprocess.run([self.yolo8, "version"], capture_output=True, text=True).stdout
        v["yolo8"]["yolo8"] = re.search(r"yolo8 (\S+)", text).group(1)
        v["yolo8"]["libtorch"] = re.search(r"LibTorch (.+)", text).group(1)
        cv = subprocess.run(["pkg-config", "--modversion", "opencv4"], capture_output=True, text=True)
        v["yolo8"]["opencv"] = cv.stdout.strip() or "unknown"
        if self.peer:
            out = subprocess.run(self.peer_cmd("-c", "import json, ultralytics, torch, cv2, numpy; print(json.dumps("
                                               "{'ultralytics': ultralytics.__version__, 'torch': torch.__version__,"
                                               " 'opencv': cv2.__version__, 'numpy': numpy.__version__, "
                                               "'torch_threads': torch.get_num_threads()}))"),
                                 capture_output=True, text=True, env=self.env())
            v["ultralytics"] = json.loads(out.stdout.strip().splitlines()[-1])
        return v


def machine():
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s+(.+)", text)
    flags = re.search(r"Flags:\s+(.+)", text)
    openmp = ", ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if os.environ.get(k))
    return {"cpu": model.group(1).strip() if model else platform.processor(), "cores": os.cpu_count(),
            "kernel": platform.release(), "openmp_wait": openmp or "libgomp's default (unset)",
            "bf16_instructions": bool(flags and re.search(r"\b(avx512_bf16|amx_bf16)\b", flags.group(1)))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="few epochs and images: a smoke run of the whole path")
    ap.add_argument("--work", help="work folder (kept); default a temporary one, removed unless --keep")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work folder")
    ap.add_argument("--no-peer", action="store_true", help="our side only, as where the peer is not installed")
    ap.add_argument("--only", default="pipeline,end_to_end,inference,startup", help="comma list of sections")
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/peer_compare.json"))
    ap.add_argument("--readme", default=str(REPO / "README.md"), help="README to rewrite ('' for none)")
    args = ap.parse_args(argv)
    runner = Runner(args)
    if not runner.peer:
        runner.say(f"peer not found: {runner.peer_reason}. Our figures only, no ratio.")
    res = {"benchmark": "peer_compare", "mode": "quick" if args.quick else "full",
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": machine(), "threads": runner.threads,
           "peer": {"available": runner.peer, "reason": runner.peer_reason},
           "versions": runner.versions(), "work": str(runner.work)}
    started = time.perf_counter()
    for section in args.only.split(","):
        res[section] = getattr(runner, section)()
    res["seconds"] = time.perf_counter() - started
    table = render_table(res)
    print()
    print(table)
    res["table"] = table
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.json}")
    if args.readme:
        readme = Path(args.readme)
        readme.write_text(splice_readme(readme.read_text(), table))
        print(f"rewrote the table in {readme}")
    print("docs/performance.md: python3 benchmarks/render_performance.py renders its tables from the JSON")
    if not runner.keep:
        shutil.rmtree(runner.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
