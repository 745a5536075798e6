#!/usr/bin/env python3
"""The results of scripts/gpu_check.sh: one JSON per stage in WORK/stages/, all merged into OUT/summary.json, which
is rebuilt after each stage (the device tool brings back few files, so everything that matters is in that one).

    gpu_check_report.py STAGE OUT WORK [KEY=VALUE ...]
    gpu_check_report.py context OUT WORK KEY=VALUE ...   (merges into WORK/context.json)
    gpu_check_report.py summary OUT WORK

STAGE is one of STAGES below. WORK holds what the stage's commands wrote (run folders,
`STAGE.cmds`: one `exit<TAB>milliseconds<TAB>command` line per command) and `context.json` (what the shell knows:
dry run, runner, time limits). Each stage JSON has status ok | failed | timeout | skipped, with `reason` unless ok;
the shell's exit status follows (failed/timeout fail the check, skipped does not). Standard library only: it runs
under the GPU machine's python3 and ours. scripts/gpu_check.md describes every field.
"""
import csv
import datetime
import glob
import json
import os
import re
import sqlite3
import sys

STAGES = ["preflight", "cuda_tests", "vram", "shared", "auto_batch", "throughput", "nvml", "nccl"]
TITLES = {
    "preflight": "what the target machine lacks for the bundle, and nvidia-smi's memory report",
    "cuda_tests": "the CUDA unit tests (the allocator-order test alone, first)",
    "vram": "peak allocated, reserved and process memory per variant, batch and precision (the memory table)",
    "shared": "two shared leases on one GPU: each process within its share plus the per-process overhead",
    "auto_batch": "batch=auto under each budget, verified by real steps and validation at twice the batch",
    "throughput": "training images/s of one variant with the real loader, per precision and determinism",
    "nvml": "NVML utilisation, device and process memory in a training run's heartbeats against nvidia-smi",
    "nccl": "a world-size-1 all-reduce through the target torch's NCCL",
}
GIB = 2 ** 30


def load_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)  # a reader (or a kill) never sees half a file


def commands(work, stage):
    rows = []
    try:
        with open(os.path.join(work, stage + ".cmds")) as f:
            for line in f:
                rc, ms, cmd = line.rstrip("\n").split("\t", 2)
                rows.append({"command": cmd, "exit": int(rc), "seconds": round(int(ms) / 1000, 2),
                             "timed_out": int(rc) in (124, 137)})
    except OSError:
        pass
    return rows


def failed_commands(rows):
    return [r for r in rows if r["exit"] != 0]


def verdict(rows, problems, skipped_reason=None):
    """Status from the commands and the checks: a timeout first, then any failure, then a skip."""
    if any(r["timed_out"] for r in rows):
        cmd = next(r for r in rows if r["timed_out"])["command"]
        return "timeout", f"timed out: {cmd}"
    bad = failed_commands(rows)
    if bad:
        return "failed", f"exit {bad[0]['exit']}: {bad[0]['command']}" + (f"; {'; '.join(problems)}" if problems else "")
    if problems:
        return "failed", "; ".join(problems)
    if skipped_reason:
        return "skipped", skipped_reason
    return "ok", None


def gib(x):
    return None if x is None or x < 0 else round(x / GIB, 3)


def stage_preflight(ctx, work, out):
    data, problems = {}, []
    try:
        data["preflight"] = open(os.path.join(work, "preflight.out"), errors="replace").read()[-6000:]
    except OSError:
        data["preflight"] = None
    try:
        data["nvidia_smi_memory"] = open(os.path.join(work, "smi_memory.txt"), errors="replace").read()[-4000:]
    except OSError:
        data["nvidia_smi_memory"] = None
    return data, problems, None


def gtest_tests(path):
    report = load_json(path)
    if report is None:
        return None
    return [{"name": f"{t['classname']}.{t['name']}", "result": t.get("result"), "time": t.get("time"),
             "failures": [f.get("failure", "")[:2000] for f in t.get("failures", [])]}
            for suite in report.get("testsuites", []) for t in suite.get("testsuite", [])]


def stage_cuda_tests(ctx, work, out):
    data, problems = {}, []
    output = []
    for name in ("cuda_tests_first", "cuda_tests"):
        try:
            output.append(open(os.path.join(work, name + ".out"), errors="replace").read()[-6000:])
        except OSError:
            pass
    data["output"] = "\n".join(output) or None
    first, rest = gtest_tests(os.path.join(work, "gtest_first.json")), gtest_tests(os.path.join(work, "gtest.json"))
    if first is None or rest is None:
        problems.append("no GoogleTest JSON report" + (" (first process)" if first is None else ""))
    data["tests"] = (first or []) + (rest or [])
    skipped = [t["name"] for t in data["tests"] if t["result"] == "SKIPPED"]
    failed = [t["name"] for t in data["tests"] if t["failures"]]
    data.update(total=len(data["tests"]), failed=len(failed), skipped=len(skipped))
    if not data["tests"]:
        problems.append("the filter selected no test")
    if failed:
        problems.append("failed: " + ", ".join(failed))
    if skipped and not ctx["dry_run"]:
        problems.append("skipped on the GPU machine: " + ", ".join(skipped))
    return data, problems, "no GPU: the CUDA tests skip themselves" if ctx["dry_run"] and skipped else None


# The rows users quote for a T4 (README: batch at 640 per variant, GB), beside which the GPU's figures are read.
SEED_ROWS = {"yolov8n": (32, 5.2), "yolov8s": (16, 7.4), "yolov8m": (8, 10.1), "yolov8l": (4, 14.5),
             "yolov8x": (2, 21.3)}


def stage_vram(ctx, work, out):
    data, problems = {"precisions": {}}, []
    for precision in ctx["vram_precisions"]:
        run = os.path.join(work, "runs", "vram_" + precision)
        profile = load_json(os.path.join(run, "profile.json"))
        table_path = os.path.join(run, "memory-table.yaml")
        table = open(table_path).read() if os.path.exists(table_path) else None
        entry = {"profile": profile, "memory_table_yaml": table}
        if profile is None:
            problems.append(f"{precision}: no profile.json")
        else:
            for v in profile:
                if not [r for r in v["rows"] if not r["out_of_memory"]]:
                    problems.append(f"{precision}: {v['variant']} fits at no batch")
            entry["peaks_gib"] = {
                os.path.splitext(v["variant"])[0]: {str(r["batch"]): None if r["out_of_memory"] else
                               {"allocated": gib(r["peak_bytes"]), "reserved": gib(r["reserved_peak_bytes"]),
                                "process": gib(r.get("process_bytes", -1)),
                                "overhead": gib(r.get("process_overhead_bytes", -1)),
                                "images_per_second": round(r["images_per_second"], 1)}
                               for r in v["rows"]} for v in profile}
            overheads = [r["process_overhead_bytes"] for v in profile for r in v["rows"]
                         if r.get("process_overhead_bytes", -1) >= 0]
            entry["process_overhead_gib"] = {"min": gib(min(overheads)), "max": gib(max(overheads))} \
                if overheads else None
            if not ctx["dry_run"] and not overheads:
                # A container without the host's PID namespace: NVML lists host PIDs. Reported, not failed.
                entry["process_memory_note"] = "NVML did not list this PID: per-process overhead unmeasured"
        data["precisions"][precision] = entry
    # AMP against float32 at the same variant and batch: on CUDA, AMP must need less (on CPU both are float32).
    amp, fp32 = (data["precisions"].get(p, {}).get("peaks_gib") for p in ("amp", "fp32"))
    if amp and fp32:
        ratios = {}
        for variant, rows in amp.items():
            for batch, row in rows.items():
                other = fp32.get(variant, {}).get(batch)
                if row and other and other["allocated"]:
                    ratios.setdefault(variant, {})[batch] = round(row["allocated"] / other["allocated"], 3)
        data["amp_over_fp32_allocated"] = ratios
        if not ctx["dry_run"]:
            worse = [f"{v}@{b}" for v, r in ratios.items() for b, x in r.items() if x >= 1.0]
            if worse:
                problems.append("AMP needs no less memory than float32 at " + ", ".join(worse))
    # The seed's rows in GB (10^9 bytes), as users quote them.
    seed = {}
    for variant, (batch, t4) in SEED_ROWS.items():
        row = {"batch": batch, "t4_figure_gb": t4}
        for precision in ("amp", "fp32"):
            figures = (data["precisions"].get(precision, {}).get("peaks_gib") or {}).get(variant, {}).get(str(batch))
            if figures:
                row[precision] = {k: None if figures[k] is None else round(figures[k] * GIB / 1e9, 2)
                                  for k in ("allocated", "reserved", "process")}
        if len(row) > 2:
            seed[variant] = row
    data["seed_rows_gb"] = seed
    if not ctx["dry_run"]:
        data["nvidia_smi_process_peak_mib"] = read_smi_apps(os.path.join(work, "smi_apps_vram.csv"))
    data["memory_table"] = "memory-table.yaml (the AMP table: what quotad reads, provenance included)" \
        if os.path.exists(os.path.join(out, "memory-table.yaml")) else None
    return data, problems, None


def results_rows(run):
    try:
        with open(os.path.join(run, "results.csv")) as f:
            return [{k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(f)]
    except OSError:
        return []


def last_train_epoch(run):
    rows = results_rows(run)
    return rows[-1] if rows else None


def read_smi_apps(path):
    """nvidia-smi --query-compute-apps samples: the largest MiB seen per PID."""
    peaks = {}
    try:
        with open(path) as f:
            for row in csv.reader(f):
                if len(row) < 2:
                    continue
                try:
                    pid, mib = int(row[0]), float(row[1])
                except ValueError:
                    continue
                peaks[pid] = max(peaks.get(pid, 0.0), mib)
    except OSError:
        pass
    return peaks


def heartbeats_of(db):
    """Every heartbeat of a quota database (quotad's or the local quota's), oldest first."""
    if not db or not os.path.exists(db):
        return []
    con = sqlite3.connect(db)
    have = {r[1] for r in con.execute("PRAGMA table_info(heartbeats)")}
    cols = [c for c in ["lease_id", "ts_ms", "step", "epoch", "gpu_util", "memory_used_gib", "gpu_util_source",
                        "device_memory_used_gib", "process_memory_used_gib"] if c in have]
    rows = [dict(zip(cols, r)) for r in con.execute(f"SELECT {', '.join(cols)} FROM heartbeats ORDER BY ts_ms")]
    con.close()
    return rows


def overhead_gib(ctx, out):
    """The per-process overhead quotad places shares with: the measured table's, else quotad's default."""
    try:
        text = open(os.path.join(out, "memory-table.yaml")).read()
        found = re.search(r"^process_overhead_gib:\s*([0-9.eE+-]+)", text, re.M)
        if found:
            return float(found.group(1)), "measured (memory-table.yaml)"
    except OSError:
        pass
    return 0.75, "quotad's default"


def stage_shared(ctx, work, out):
    data, problems = {}, []
    if not ctx["decode"]:
        return data, problems, "no training run: " + ctx["decode_reason"]
    share = float(ctx["share_gib"])
    overhead, basis = overhead_gib(ctx, out)
    data.update(share_gib=share, overhead_gib=overhead, overhead_basis=basis)
    runs = {}
    for name in ("shared_alone", "shared_0", "shared_1"):
        run = os.path.join(work, "runs", name)
        cost = load_json(os.path.join(run, "cost.json"))
        last = last_train_epoch(run)
        try:
            text = open(os.path.join(work, name + ".out"), errors="replace").read()
        except OSError:
            text = ""
        entry = {"images_per_second": float(last["images_per_s"]) if last else None,
                 "peak_allocated_gib": cost.get("peak_memory_gib") if cost else None,
                 "lease_memory_gib": cost.get("lease_memory_gib") if cost else None,
                 "granted_a_share": "a share of 1 GPU" in text, "waited": "waiting (" in text}
        batch = re.findall(r"auto-batch[^\n]*?batch (\d+)", text)
        entry["batch"] = int(batch[-1]) if batch else None
        runs[name] = entry
        if cost is None:
            problems.append(f"{name}: no cost.json")
        elif cost.get("peak_memory_gib", 0) > share + 1e-9:
            problems.append(f"{name}: allocator peak {cost['peak_memory_gib']:.2f} GiB over the {share} GiB share")
        if not entry["granted_a_share"]:
            problems.append(f"{name}: not granted a share")
    if runs["shared_0"]["waited"] or runs["shared_1"]["waited"]:
        problems.append("one of the two shared runs waited for the other: they did not share the GPU")
    data["runs"] = runs
    pair = [runs[n]["images_per_second"] for n in ("shared_0", "shared_1") if runs[n]["images_per_second"]]
    alone = runs["shared_alone"]["images_per_second"]
    if alone and len(pair) == 2:
        data["slowdown"] = {"alone_images_per_second": alone, "each_of_two_images_per_second": pair,
                            "each_over_alone": [round(x / alone, 3) for x in pair],
                            "two_together_over_alone": round(sum(pair) / alone, 3)}
    if not ctx["dry_run"]:
        peaks = read_smi_apps(os.path.join(work, "smi_apps.csv"))
        data["nvidia_smi_process_peak_mib"] = peaks
        limit = (share + overhead) * 1024
        if len(peaks) < 2:
            problems.append(f"nvidia-smi listed {len(peaks)} processes during the pair (want 2)")
        over = {pid: mib for pid, mib in peaks.items() if mib > limit}
        if over:
            problems.append(f"processes over share + overhead ({limit:.0f} MiB): {over}")
    beats = [b for b in heartbeats_of(ctx.get("quota_db")) if b.get("process_memory_used_gib") is not None]
    per_lease = {}
    for b in beats:
        if b["process_memory_used_gib"] >= 0:
            per_lease.setdefault(b["lease_id"], []).append(b["process_memory_used_gib"])
    data["heartbeat_process_memory_gib"] = {str(k): round(max(v), 3) for k, v in per_lease.items()}
    return data, problems, None


def stage_auto_batch(ctx, work, out):
    data, problems = {"budgets": {}}, []
    for budget in ctx["auto_budgets"]:
        result = load_json(os.path.join(work, "runs", f"auto_{budget}", "auto_batch.json"))
        data["budgets"][budget] = result
        if result is None:
            problems.append(f"{budget} GiB: no auto_batch.json")
            continue
        for row in result["rows"]:
            name = f"{row['variant']} under {budget} GiB"
            if not row["fits"]:
                problems.append(f"{name}: does not fit")
            elif row["out_of_memory_after"]:
                problems.append(f"{name}: {row['out_of_memory_after']} out-of-memory errors after sizing")
            elif row["confirmed_peak_gib"] > row["budget_gib"]:
                problems.append(f"{name}: confirmed peak {row['confirmed_peak_gib']:.2f} GiB over the cap")
    data["checks"] = "every variant fits, 0 OOM in 3 more steps and a validation at 2x the batch, peak <= budget"
    return data, problems, None


def data_wait_share(log_path):
    """The last epoch's 'time: steps X s, waiting for data Y s (Z%)' line of a train log."""
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return None
    found = re.findall(r"time: steps ([0-9.]+) s, waiting for data ([0-9.]+) s \(([0-9.]+)%\)", text)
    if not found:
        return None
    steps, wait, share = found[-1]
    return {"steps_s": float(steps), "waiting_for_data_s": float(wait), "waiting_share": float(share) / 100}


THROUGHPUT_MODES = {"amp_deterministic": "AMP float16, deterministic=true (cuDNN without autotuning)",
                    "amp_autotuned": "AMP float16, deterministic=false (cuDNN autotuning)",
                    "amp_bfloat16": "AMP bfloat16 (amp_dtype=bfloat16, no loss scaling), deterministic=false",
                    "fp32": "float32 (TF32 convolutions: cuDNN's default)"}


def stage_throughput(ctx, work, out):
    data, problems = {"modes": {}}, []
    variant = ctx["throughput_variant"]
    name = "yolov8" + variant if len(variant) == 1 else variant
    profile = load_json(os.path.join(work, "runs", "synthetic", "profile.json"))
    if profile is None:
        problems.append("no synthetic profile.json")
    rows = [r for v in profile or [] for r in v["rows"] if not r["out_of_memory"]]
    synthetic = rows[-1]["images_per_second"] if rows else None
    data["synthetic_images_per_second"] = synthetic
    skipped = None if ctx["decode"] else ctx["decode_reason"]
    if not skipped:
        for mode, title in THROUGHPUT_MODES.items():
            run = os.path.join(work, "runs", "tp_" + mode)
            rows = results_rows(run)
            entry = {"title": title}
            if not rows:
                problems.append(f"{mode}: no results.csv from the real loader's run")
            else:
                last = rows[-1]
                # results.csv's images_per_s is the run's mean so far, the first epoch's start-up (cuDNN, the
                # loader's first batches) included; the last epoch alone is the difference of the last two rows.
                k = len(rows)
                ips = [float(r["images_per_s"]) for r in rows]
                entry["run_mean_images_per_second"] = ips[-1]
                if k >= 2 and ips[-1] > 0 and ips[-2] > 0 and k / ips[-1] > (k - 1) / ips[-2]:
                    entry["images_per_second"] = round(1.0 / (k / ips[-1] - (k - 1) / ips[-2]), 1)
                else:
                    entry["images_per_second"] = ips[-1]
                entry["epoch"] = int(float(last["epoch"]))
                entry["time"] = data_wait_share(os.path.join(work, f"train_{mode}.out"))
                entry["cost"] = load_json(os.path.join(run, "cost.json"))
                if synthetic and mode != "fp32":
                    entry["real_over_synthetic"] = round(entry["images_per_second"] / synthetic, 3)
            data["modes"][mode] = entry
    data["settings"] = {"variant": name, "imgsz": ctx["throughput_imgsz"], "batch": ctx["throughput_batch"],
                        "channels_last": True, "dataset": ctx.get("dataset")}
    return data, problems, ("real loader " + skipped) if skipped else None


def read_smi(path):
    samples = []
    try:
        with open(path) as f:
            for row in csv.reader(f):
                if len(row) < 4:
                    continue
                try:
                    ts = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
                    ts = ts.replace(tzinfo=datetime.timezone.utc).timestamp()  # nvidia-smi ran with TZ=UTC
                    samples.append({"t": ts, "util": float(row[1]), "used_mib": float(row[2]),
                                    "total_mib": float(row[3])})
                except ValueError:
                    continue
    except OSError:
        pass
    return samples


def stage_nvml(ctx, work, out):
    data, problems = {}, []
    heartbeats = heartbeats_of(ctx.get("quota_db"))
    # This stage's run holds the newest lease (the shared stage's runs used the same quotad before it).
    newest = max((hb["lease_id"] for hb in heartbeats if "lease_id" in hb), default=None)
    heartbeats = [hb for hb in heartbeats if hb.get("lease_id") == newest]
    data["heartbeats"] = heartbeats
    if not heartbeats:
        problems.append("the training run's lease recorded no heartbeat")
    if ctx["dry_run"] or not ctx["decode"]:
        reason = "no GPU: NVML and nvidia-smi not compared" if ctx["dry_run"] else \
            "no training run: " + ctx["decode_reason"]
        if not ctx["decode"] and not ctx["dry_run"]:
            problems = []
        return data, problems, reason
    smi = read_smi(os.path.join(work, "smi.csv"))
    data["nvidia_smi_samples"] = len(smi)
    apps = read_smi_apps(os.path.join(work, "smi_apps_nvml.csv"))
    data["nvidia_smi_process_peak_mib"] = apps
    # A heartbeat's utilisation is the driver's mean since the previous heartbeat; nvidia-smi's samples over the same
    # interval are four readings of the driver's last period, so each pair agrees loosely and the run's means tightly.
    tolerance = {"util_points": 25, "run_mean_util_points": 10, "memory_mib": 256, "memory_share": 0.05}
    data["tolerance"] = tolerance
    compared = []
    previous_t = None
    for hb in heartbeats:
        t = hb["ts_ms"] / 1000
        since = previous_t if previous_t is not None else t - 2.0
        previous_t = t
        if hb["gpu_util_source"] != "nvml" or hb["step"] is None or hb["step"] < 0:
            continue
        window = [x for x in smi if since < x["t"] <= t]
        near = [x for x in smi if abs(x["t"] - t) <= 1.5]
        if len(window) < 2 or not near:
            continue
        closest = min(near, key=lambda x: abs(x["t"] - t))
        used = hb["device_memory_used_gib"] * 1024
        util = hb["gpu_util"] * 100
        smi_util = sum(x["util"] for x in window) / len(window)
        used_lo, used_hi = min(x["used_mib"] for x in near), max(x["used_mib"] for x in near)
        row = {"ts_ms": hb["ts_ms"], "step": hb["step"], "nvml_util_interval_mean": round(util, 1),
               "smi_util_interval_mean": round(smi_util, 1), "smi_samples_in_interval": len(window),
               "nvml_used_mib": round(used), "smi_used_mib_closest": closest["used_mib"],
               "smi_used_mib_range": [used_lo, used_hi]}
        if hb.get("process_memory_used_gib") is not None and hb["process_memory_used_gib"] >= 0:
            row["process_used_mib"] = round(hb["process_memory_used_gib"] * 1024)
        row["util_matches"] = abs(util - smi_util) <= tolerance["util_points"]
        slack = max(tolerance["memory_mib"], tolerance["memory_share"] * closest["used_mib"])
        row["memory_matches"] = used_lo - slack <= used <= used_hi + slack
        compared.append(row)
    data["compared"] = compared
    if compared:
        nvml_mean = sum(r["nvml_util_interval_mean"] for r in compared) / len(compared)
        smi_mean = sum(r["smi_util_interval_mean"] for r in compared) / len(compared)
        data["run_mean_util"] = {"nvml": round(nvml_mean, 1), "nvidia_smi": round(smi_mean, 1)}
        if abs(nvml_mean - smi_mean) > tolerance["run_mean_util_points"]:
            problems.append(f"the heartbeats' mean utilisation {nvml_mean:.0f} % differs from nvidia-smi's "
                            f"{smi_mean:.0f} % over the same intervals")
    nvml_beats = [hb for hb in heartbeats if hb["gpu_util_source"] == "nvml"]
    data["nvml_heartbeats"] = len(nvml_beats)
    want = 8 if ctx.get("quota_db", "").endswith("quotad/quota.db") else 2  # 2 s heartbeats, or the local 10 s
    data["comparisons_wanted"] = want
    if not nvml_beats:
        sources = sorted({hb["gpu_util_source"] or "none" for hb in heartbeats})
        problems.append(f"no heartbeat with gpu_util_source=nvml (sources: {', '.join(sources)})")
    elif len(compared) < want:
        problems.append(f"{len(compared)} heartbeats during training had an nvidia-smi sample within 1.5 s "
                        f"(want {want})")
    else:
        bad = [r for r in compared if not (r["util_matches"] and r["memory_matches"])]
        if bad:
            problems.append(f"{len(bad)} of {len(compared)} heartbeats disagree with nvidia-smi")
    with_process = [r for r in compared if "process_used_mib" in r]
    data["process_memory_reported"] = len(with_process)
    if compared and not with_process:
        # Only where NVML names host PIDs (a container without the host's PID namespace): reported, not failed.
        data["process_memory_note"] = "no heartbeat had the process's own memory: NVML did not list the trainer's PID"
    return data, problems, None


def stage_nccl(ctx, work, out):
    data, problems = {}, []
    result = load_json(os.path.join(work, "nccl.json"))
    data["result"] = result
    if result is None:
        problems.append("no nccl.json")
        return data, problems, None
    if "skipped" in result:
        return data, problems, result["skipped"]
    if not result.get("sum_correct"):
        problems.append("the all-reduce changed the values of a world of one")
    return data, problems, None


def rebuild_summary(out, work, ctx):
    summary = {"check": "scripts/gpu_check.sh", "dry_run": ctx["dry_run"], "started": ctx["started"],
               "runner": ctx["runner"], "yolo8_version": ctx.get("version"), "machine": ctx.get("machine"),
               "image_decoding": ctx["decode"], "image_decoding_reason": None if ctx["decode"] else ctx["decode_reason"],
               "time_limit_s": ctx["total_seconds"], "stages": {}}
    for stage in ctx["stages"]:
        result = load_json(os.path.join(work, "stages", stage + ".json"))
        summary["stages"][stage] = result if result else {"status": "pending"}
    statuses = [s["status"] for s in summary["stages"].values()]
    summary["status"] = "failed" if any(s in ("failed", "timeout") for s in statuses) else \
        "running" if "pending" in statuses else "ok"
    summary["seconds"] = round(datetime.datetime.now(datetime.timezone.utc).timestamp() - ctx["started_epoch"], 1)
    write_json(os.path.join(out, "summary.json"), summary)
    return summary


BOOLS = {"dry_run", "decode"}
INTS = {"total_seconds", "throughput_imgsz", "throughput_batch"}
FLOATS = {"started_epoch"}
LISTS = {"stages", "vram_precisions", "auto_budgets"}


def set_context(work, pairs):
    path = os.path.join(work, "context.json")
    ctx = load_json(path, {})
    for pair in pairs:
        key, value = pair.split("=", 1)
        if key in BOOLS:
            ctx[key] = value not in ("", "0", "false")
        elif key in INTS:
            ctx[key] = int(value)
        elif key in FLOATS:
            ctx[key] = float(value)
        elif key in LISTS:
            ctx[key] = [v for v in re.split(r"[ ,]+", value) if v]
        else:
            ctx[key] = value
    write_json(path, ctx)


def main():
    stage, out, work = sys.argv[1:4]
    if stage == "context":
        set_context(work, sys.argv[4:])
        return 0
    ctx = load_json(os.path.join(work, "context.json"))
    if stage == "summary":
        summary = rebuild_summary(out, work, ctx)
        print(json.dumps({k: v["status"] for k, v in summary["stages"].items()}))
        return 0
    extra = dict(a.split("=", 1) for a in sys.argv[4:])
    rows = commands(work, stage)
    if extra.get("status") == "skipped":  # skipped by the shell (no time left, not selected)
        data, problems, skipped = {}, [], extra.get("reason", "skipped")
    else:
        data, problems, skipped = globals()["stage_" + stage](ctx, work, out)
    status, reason = verdict(rows, problems, skipped)
    if extra.get("status") == "timeout":
        status, reason = "timeout", extra.get("reason", "the stage ran out of time")
    result = {"stage": stage, "title": TITLES[stage], "status": status, "reason": reason, "dry_run": ctx["dry_run"],
              "seconds": float(extra.get("seconds", 0)), "timeout_s": int(extra.get("timeout_s", 0)),
              "commands": rows}
    result.update(data)
    os.makedirs(os.path.join(work, "stages"), exist_ok=True)
    write_json(os.path.join(work, "stages", stage + ".json"), result)
    rebuild_summary(out, work, ctx)
    print(f"{stage}: {status}" + (f" ({reason})" if reason else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
