#!/usr/bin/env python3
"""The JSON files of scripts/gpu_check.sh: one per stage, and summary.json rebuilt after each stage.

    gpu_check_report.py STAGE OUT WORK [KEY=VALUE ...]
    gpu_check_report.py context OUT WORK KEY=VALUE ...   (merges into WORK/context.json)
    gpu_check_report.py summary OUT WORK

STAGE is vram, auto_batch, throughput, cuda_tests or nvml. WORK holds what the stage's commands wrote (run folders,
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

STAGES = ["vram", "auto_batch", "throughput", "cuda_tests", "nvml"]
TITLES = {
    "vram": "peak allocated and reserved memory per variant, batch and precision (the memory table)",
    "auto_batch": "batch=auto under each budget, verified by real steps and validation at twice the batch",
    "throughput": "training images/s: the real loader (decode included) against synthetic batches",
    "cuda_tests": "the CUDA unit tests",
    "nvml": "NVML utilisation and memory in a training run's heartbeats against nvidia-smi",
}


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
                fits = [r for r in v["rows"] if not r["out_of_memory"]]
                if not fits:
                    problems.append(f"{precision}: {v['variant']} fits at no batch")
            entry["peaks_gib"] = {
                os.path.splitext(v["variant"])[0]: {str(r["batch"]): None if r["out_of_memory"] else
                               {"allocated": round(r["peak_bytes"] / 2**30, 3),
                                "reserved": round(r["reserved_peak_bytes"] / 2**30, 3),
                                "images_per_second": round(r["images_per_second"], 1)}
                               for r in v["rows"]} for v in profile}
        data["precisions"][precision] = entry
    # AMP against float32 at the same variant and batch: on CUDA, AMP must need less (on CPU both are float32).
    amp, fp32 = (data["precisions"].get(p, {}).get("peaks_gib") for p in ("amp", "fp32"))
    if amp and fp32:
        ratios = {}
        for variant, rows in amp.items():
            for batch, row in rows.items():
                other = fp32.get(variant, {}).get(batch)
                if row and other and other["allocated"] > 0:
                    ratios.setdefault(variant, {})[batch] = round(row["allocated"] / other["allocated"], 3)
        data["amp_over_fp32_allocated"] = ratios
        if not ctx["dry_run"]:
            worse = [f"{v}@{b}" for v, r in ratios.items() for b, x in r.items() if x >= 1.0]
            if worse:
                problems.append("AMP needs no less memory than float32 at " + ", ".join(worse))
    data["memory_table"] = "memory-table.yaml (the AMP table: what quotad reads, provenance included)" \
        if os.path.exists(os.path.join(out, "memory-table.yaml")) else None
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


def last_train_epoch(run):
    try:
        with open(os.path.join(run, "results.csv")) as f:
            rows = [{k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(f)]
    except OSError:
        return None
    return rows[-1] if rows else None


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


def stage_throughput(ctx, work, out):
    data, problems = {"variants": {}}, []
    profile = load_json(os.path.join(work, "runs", "synthetic", "profile.json"))
    if profile is None:
        problems.append("no synthetic profile.json")
    synthetic = {}
    for v in profile or []:
        name = os.path.splitext(v["variant"])[0]
        rows = [r for r in v["rows"] if not r["out_of_memory"]]
        synthetic[name] = rows[-1]["images_per_second"] if rows else None
    skipped = None if ctx["decode"] else ctx["decode_reason"]
    for variant in ctx["throughput_variants"]:
        name = "yolov8" + variant if len(variant) == 1 else variant
        entry = {"synthetic_images_per_second": synthetic.get(name)}
        if ctx["decode"]:
            run = os.path.join(work, "runs", "real_" + variant)
            last = last_train_epoch(run)
            if last is None:
                problems.append(f"{name}: no results.csv from the real loader's run")
            else:
                entry["real_loader_images_per_second"] = float(last["images_per_s"])
                entry["real_loader_epoch"] = int(float(last["epoch"]))
                entry["time"] = data_wait_share(os.path.join(work, f"train_real_{variant}.out"))
                entry["cost"] = load_json(os.path.join(run, "cost.json"))
                if entry["synthetic_images_per_second"]:
                    entry["real_over_synthetic"] = round(
                        entry["real_loader_images_per_second"] / entry["synthetic_images_per_second"], 3)
        else:
            entry["real_loader"] = "skipped: " + skipped
        data["variants"][name] = entry
    data["settings"] = {"imgsz": ctx["throughput_imgsz"], "batch": ctx["throughput_batch"], "amp": True,
                        "channels_last": True, "dataset": ctx.get("dataset")}
    return data, problems, ("real loader " + skipped) if skipped else None


def stage_cuda_tests(ctx, work, out):
    data, problems = {}, []
    report = load_json(os.path.join(work, "gtest.json"))
    try:
        data["output"] = open(os.path.join(work, "cuda_tests.out"), errors="replace").read()[-8000:]
    except OSError:
        data["output"] = None
    if report is None:
        problems.append("no GoogleTest JSON report")
        return data, problems, None
    tests = [t for suite in report.get("testsuites", []) for t in suite.get("testsuite", [])]
    data["tests"] = [{"name": f"{t['classname']}.{t['name']}", "result": t.get("result"), "time": t.get("time"),
                      "failures": [f.get("failure", "")[:2000] for f in t.get("failures", [])]} for t in tests]
    skipped = [t["name"] for t in data["tests"] if t["result"] == "SKIPPED"]
    failed = [t["name"] for t in data["tests"] if t["failures"]]
    data.update(total=len(tests), failed=len(failed), skipped=len(skipped))
    if not tests:
        problems.append("the filter selected no test")
    if failed:
        problems.append("failed: " + ", ".join(failed))
    if skipped and not ctx["dry_run"]:
        problems.append("skipped on the GPU machine: " + ", ".join(skipped))
    return data, problems, "no GPU: the CUDA tests skip themselves" if ctx["dry_run"] and skipped else None


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
    db = os.path.join(work, "quota.db")
    heartbeats = []
    if os.path.exists(db):
        con = sqlite3.connect(db)
        cols = ["ts_ms", "step", "epoch", "gpu_util", "memory_used_gib", "gpu_util_source", "device_memory_used_gib"]
        heartbeats = [dict(zip(cols, r)) for r in con.execute(f"SELECT {', '.join(cols)} FROM heartbeats ORDER BY ts_ms")]
        con.close()
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
    tolerance = {"util_points": 20, "memory_mib": 256, "memory_share": 0.05}
    data["tolerance"] = tolerance
    compared = []
    for hb in heartbeats:
        if hb["gpu_util_source"] != "nvml" or hb["step"] is None or hb["step"] < 0:
            continue
        t = hb["ts_ms"] / 1000
        near = [s for s in smi if abs(s["t"] - t) <= 1.5]
        if not near:
            continue
        closest = min(near, key=lambda s: abs(s["t"] - t))
        used = hb["device_memory_used_gib"] * 1024
        util = hb["gpu_util"] * 100
        util_lo, util_hi = min(s["util"] for s in near), max(s["util"] for s in near)
        row = {"ts_ms": hb["ts_ms"], "step": hb["step"], "nvml_util": round(util, 1),
               "smi_util_closest": closest["util"], "smi_util_range": [util_lo, util_hi],
               "nvml_used_mib": round(used), "smi_used_mib_closest": closest["used_mib"]}
        row["util_matches"] = util_lo - tolerance["util_points"] <= util <= util_hi + tolerance["util_points"]
        row["memory_matches"] = abs(used - closest["used_mib"]) <= max(tolerance["memory_mib"],
                                                                       tolerance["memory_share"] * closest["used_mib"])
        compared.append(row)
    data["compared"] = compared
    nvml_beats = [hb for hb in heartbeats if hb["gpu_util_source"] == "nvml"]
    data["nvml_heartbeats"] = len(nvml_beats)
    if not nvml_beats:
        sources = sorted({hb["gpu_util_source"] or "none" for hb in heartbeats})
        problems.append(f"no heartbeat with gpu_util_source=nvml (sources: {', '.join(sources)})")
    elif len(compared) < 2:
        problems.append(f"{len(compared)} heartbeats during training had an nvidia-smi sample within 1.5 s (want 2)")
    else:
        bad = [r for r in compared if not (r["util_matches"] and r["memory_matches"])]
        if bad:
            problems.append(f"{len(bad)} of {len(compared)} heartbeats disagree with nvidia-smi")
    return data, problems, None


def rebuild_summary(out, work, ctx):
    summary = {"check": "scripts/gpu_check.sh", "dry_run": ctx["dry_run"], "started": ctx["started"],
               "runner": ctx["runner"], "yolo8_version": ctx.get("version"), "machine": ctx.get("machine"),
               "image_decoding": ctx["decode"], "image_decoding_reason": None if ctx["decode"] else ctx["decode_reason"],
               "time_limit_s": ctx["total_seconds"], "stages": {}}
    for stage in ctx["stages"]:
        result = load_json(os.path.join(out, stage + ".json"))
        summary["stages"][stage] = {"status": result["status"], "reason": result.get("reason"),
                                    "seconds": result.get("seconds"), "timeout_s": result.get("timeout_s")} \
            if result else {"status": "pending"}
    statuses = [s["status"] for s in summary["stages"].values()]
    summary["status"] = "failed" if any(s in ("failed", "timeout") for s in statuses) else \
        "running" if "pending" in statuses else "ok"
    summary["seconds"] = round(datetime.datetime.now(datetime.timezone.utc).timestamp() - ctx["started_epoch"], 1)
    write_json(os.path.join(out, "summary.json"), summary)
    return summary


BOOLS = {"dry_run", "decode"}
INTS = {"total_seconds", "throughput_imgsz", "throughput_batch"}
FLOATS = {"started_epoch"}
LISTS = {"stages", "vram_precisions", "auto_budgets", "throughput_variants"}


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
    write_json(os.path.join(out, stage + ".json"), result)
    rebuild_summary(out, work, ctx)
    print(f"{stage}: {status}" + (f" ({reason})" if reason else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
