#!/usr/bin/env python3
"""swarm_plot.py: the tables and plots of the swarm study (swarm_study.sh).

Reads OUT/<config>/ as the study script leaves it (each process's
log.jsonl with wall-clock stamps in pN.tlog, pN.start/.end, pN.err with the
swarm's summary line, eval-p0.out, diff-pN.txt, uptime) and OUT/load.txt;
writes OUT/summary.md, OUT/summary.json and DOC/swarm_*.png. A doc
generator, not part of visc: needs python3-matplotlib."""
import argparse
import json
import os
import re
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("swarm_plot.py: needs matplotlib (Debian: apt-get install python3-matplotlib)")

SWARM_LINE = re.compile(
    r"visc: swarm: (\d+) steps, (\d+) rounds \((\d+) failed, (\d+) partial\), (\d+) skipped, "
    r"(\d+) local, (\d+) state downloads, ([\d.]+) MB sent, ([\d.]+) MB received, "
    r"([\d.]+) s averaging")
EVAL_LINE = re.compile(r"top1 ([\d.]+)%")

LABELS = {
    "base_lamb": "1 process, LAMB, batch {T}",
    "grad_lamb": "swarm, gradient avg., LAMB, target {T}",
    "grad_lamb_fp16": "swarm, gradient avg., LAMB, fp16",
    "grad_lamb_q8": "swarm, gradient avg., LAMB, q8",
    "base_adamw": "1 process, AdamW, batch {B}",
    "param_adamw": "swarm, parameter avg., AdamW, every {T}",
    "param_adamw_fp16": "swarm, parameter avg., AdamW, fp16",
    "param_adamw_q8": "swarm, parameter avg., AdamW, q8",
    "grad_lamb_equal": "swarm of equal peers, gradient avg., LAMB",
    "param_adamw_equal": "swarm of equal peers, parameter avg., AdamW",
}
STYLE = {
    "base_lamb": ("tab:blue", "--"),
    "grad_lamb": ("tab:blue", "-"),
    "grad_lamb_fp16": ("tab:cyan", "-"),
    "grad_lamb_q8": ("tab:purple", "-"),
    "base_adamw": ("tab:red", "--"),
    "param_adamw": ("tab:red", "-"),
    "param_adamw_fp16": ("tab:orange", "-"),
    "param_adamw_q8": ("tab:brown", "-"),
    "grad_lamb_equal": ("tab:green", ":"),
    "param_adamw_equal": ("tab:olive", ":"),
}


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def stamped_records(path):
    """(wall time, record) for every JSON line of a .tlog."""
    out = []
    for line in read(path).splitlines():
        ts, _, js = line.partition(" ")
        try:
            out.append((float(ts), json.loads(js)))
        except ValueError:
            continue
    return out


def window_losses(records, print_freq, steps_per_epoch):
    """Train records carry the running mean of the local epoch's batch
    losses; the mean over each print window is d_k m_k - d_j m_j over
    d_k - d_j, with d the batches done in the epoch at the record."""
    out, epoch, k, prev_d, prev_m = [], None, 0, 0, 0.0
    for ts, r in records:
        if r.get("type") != "train":
            continue
        if r["epoch"] != epoch:
            epoch, k, prev_d, prev_m = r["epoch"], 0, 0, 0.0
        k += 1
        d = min(k * print_freq, steps_per_epoch)
        if d <= prev_d:
            continue
        w = (d * r["loss"] - prev_d * prev_m) / (d - prev_d)
        out.append((ts, r["step"], w, d - prev_d))
        prev_d, prev_m = d, r["loss"]
    return out


def batch_times(records, print_freq, steps_per_epoch):
    """(wall time, batches done since the previous record) per train record."""
    out, epoch, prev = [], None, 0
    for ts, r in records:
        if r.get("type") != "train":
            continue
        if r["epoch"] != epoch:
            epoch, prev = r["epoch"], 0
        d = min(prev + print_freq, steps_per_epoch)
        out.append((ts, d - prev))
        prev = d
    return out


def local_batches(records, print_freq, steps_per_epoch):
    """Batches a process ran (to a print window: the last one is unlogged)."""
    total, epoch, k = 0, None, 0
    per_epoch = {}
    for _, r in records:
        if r.get("type") != "train":
            continue
        if r["epoch"] != epoch:
            epoch, k = r["epoch"], 0
        k += 1
        per_epoch[epoch] = min(k * print_freq, steps_per_epoch)
    for v in per_epoch.values():
        total += v
    return total


def load_during(load, t0, t1):
    vals = [v for t, v in load if t0 <= t <= t1]
    return (sum(vals) / len(vals), max(vals)) if vals else (None, None)


def analyse(out, cfg, a, load):
    d = os.path.join(out, cfg)
    swarm = not cfg.startswith("base_")
    peers = [p for p in ("p0", "p1", "p2", "p3") if os.path.exists(os.path.join(d, p + ".start"))]
    if not peers:
        return None
    starts = {p: float(read(os.path.join(d, p + ".start")).split()[0]) for p in peers}
    ends = {}
    for p in peers:
        e = read(os.path.join(d, p + ".end")).split()
        ends[p] = (int(e[0]), float(e[1])) if len(e) == 2 else (None, None)
    t0 = min(starts.values())
    t1 = max([e[1] for e in ends.values() if e[1]] or [t0])
    batch = a.peer_batch if swarm else (a.target if cfg == "base_lamb" else a.peer_batch)
    per_step = a.target if swarm else batch
    shard = a.train_size // 4 if swarm else a.train_size
    spe = shard // batch
    res = {"config": cfg, "swarm": swarm, "peers": {}, "val": [], "loss": [],
           "wall_s": t1 - t0, "failed": os.path.exists(os.path.join(d, "FAILED"))}
    res["final_peers"] = {}
    for p in peers:
        m = EVAL_LINE.search(read(os.path.join(d, "eval-%s.out" % p)))
        if m:
            res["final_peers"][p] = float(m.group(1))
    res["final_top1"] = res["final_peers"].get("p0")
    steps = 0
    recs_of = {p: stamped_records(os.path.join(d, p + ".tlog")) for p in peers}
    # samples processed by all processes by a wall time: the honest x axis
    # (a swarm step may hold fewer than the target's samples, and the
    # gradients of a peer that takes a downloaded state are dropped)
    done = sorted((ts, n * batch) for p in peers
                  for ts, n in batch_times(recs_of[p], a.print_freq, spe))
    cum, tot = [], 0
    for ts, n in done:
        tot += n
        cum.append((ts, tot))

    def processed(ts):
        lo, hi = 0, len(cum)
        while lo < hi:
            mid = (lo + hi) // 2
            if cum[mid][0] <= ts:
                lo = mid + 1
            else:
                hi = mid
        return cum[lo - 1][1] if lo else 0

    for p in peers:
        recs = recs_of[p]
        info = {"exit": ends[p][0], "seconds": (ends[p][1] or t1) - starts[p],
                "batches": local_batches(recs, a.print_freq, spe)}
        info["samples"] = info["batches"] * batch
        for ts, r in recs:
            if r.get("type") in ("val", "val_step"):
                res["val"].append((processed(ts), ts - t0, r["top1"], p, r["step"] * per_step))
                steps = max(steps, r["step"])
            if r.get("type") == "train":
                steps = max(steps, r["step"])
        if p == "p0":
            for ts, step, w, n in window_losses(recs, a.print_freq, spe):
                res["loss"].append((processed(ts), ts - t0, w))
        sm = SWARM_LINE.search(read(os.path.join(d, p + ".err")))
        if sm:
            g = sm.groups()
            info.update(steps=int(g[0]), rounds=int(g[1]), failed=int(g[2]), partial=int(g[3]),
                        skipped=int(g[4]), local=int(g[5]), downloads=int(g[6]),
                        mb_sent=float(g[7]), mb_received=float(g[8]), avg_s=float(g[9]))
            info["avg_share"] = info["avg_s"] / info["seconds"] if info["seconds"] > 0 else None
            steps = max(steps, info["steps"])
        if p != "p0":
            txt = read(os.path.join(d, "diff-%s.txt" % p))
            differs = [l for l in txt.splitlines() if l.startswith("differs:")]
            real = [l for l in differs if "num_batches_tracked" not in l]
            compared = re.search(r"^\d+ tensors", txt, re.M) is not None
            info["same_as_p0"] = (len(real) == 0) if compared else None
            info["diff_lines"] = len(real)
        res["peers"][p] = info
    res["steps"] = steps
    res["samples"] = steps * per_step
    res["local_samples"] = sum(i["samples"] for i in res["peers"].values())
    res["val"].sort()
    res["loss"].sort()
    res["load_mean"], res["load_max"] = load_during(load, t0, t1)
    res["events"] = len(read(os.path.join(d, "swarm_events.txt")).splitlines())
    return res


def smooth(ys, k):
    out = []
    for i in range(len(ys)):
        lo = max(0, i - k + 1)
        out.append(sum(ys[lo:i + 1]) / (i + 1 - lo))
    return out


def label(cfg, a):
    return LABELS.get(cfg, cfg).format(T=a.target, B=a.peer_batch)


def plot_acc(results, a, xi, xlabel, path, title):
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        c, ls = STYLE.get(r["config"], ("k", "-"))
        pts = [(v[xi], v[2]) for v in r["val"]]
        if r["final_top1"] is not None:
            pts.append((r["local_samples"] if xi == 0 else r["wall_s"], r["final_top1"]))
        pts.sort()
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=c, marker="o",
                    markersize=3, label=label(r["config"], a))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("Fashion-MNIST test top-1 (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_loss(results, a, path):
    fig, axs = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        c, ls = STYLE.get(r["config"], ("k", "-"))
        if not r["loss"]:
            continue
        ys = smooth([p[2] for p in r["loss"]], 5)
        axs[0].plot([p[0] for p in r["loss"]], ys, ls, color=c, lw=1, label=label(r["config"], a))
        pts = sorted((p[1], y) for p, y in zip(r["loss"], ys))
        axs[1].plot([p[0] for p in pts], [p[1] for p in pts], ls, color=c, lw=1)
    axs[0].set_xlabel("training samples processed (all processes together)")
    axs[1].set_xlabel("wall time (s; every process on one 2-core machine)")
    for ax in axs:
        ax.set_ylabel("training loss (peer 0's batches, mean of 5 windows)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    axs[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_compression(results, a, path):
    rs = [r for r in results if r["swarm"]]
    if not rs:
        return
    fig, axs = plt.subplots(1, 3, figsize=(13, 4))
    names = [r["config"] for r in rs]
    colors = [STYLE.get(n, ("k", "-"))[0] for n in names]
    def mean(vals):  # over the peers that reported (a killed peer has no summary)
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else 0

    mb = [mean([i.get("mb_sent") for i in r["peers"].values()]) for r in rs]
    top1 = [r["final_top1"] or 0 for r in rs]
    share = [100 * mean([i.get("avg_share") for i in r["peers"].values()]) for r in rs]
    for ax, ys, yl in ((axs[0], top1, "final test top-1 of peer 0 (%)"),
                       (axs[1], mb, "MB sent per peer (mean over peers)"),
                       (axs[2], share, "time in averaging (% of a peer's run, mean)")):
        ax.bar(range(len(rs)), ys, color=colors)
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels(names, fontsize=7, rotation=35, ha="right")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3, axis="y")
        for i, (y, r) in enumerate(zip(ys, rs)):
            txt = "%.1f" % y if r["final_top1"] is not None else "no model"
            ax.text(i, y, txt, ha="center", va="bottom", fontsize=7)
    axs[0].set_ylim(0, 100)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt(x, f="%.1f"):
    return "-" if x is None else f % x


def table(results, a):
    rows = ["| configuration | final test top-1 (p0; range over peers) | global steps x target batch "
            "| samples processed (all processes) | global steps | wall time | MB sent per peer (p0/p1/p2/p3) | "
            "averaging share per peer | sample share per peer | one model at the end | "
            "load avg (mean/max) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ps = [r["peers"][p] for p in sorted(r["peers"])]
        tot = sum(i["samples"] for i in ps) or 1
        if r["swarm"]:
            mb = "/".join(fmt(i.get("mb_sent")) for i in ps)
            share = "/".join(fmt(100 * i["avg_share"], "%.0f%%") if i.get("avg_share") is not None
                             else "-" for i in ps)
            same = [i.get("same_as_p0") for i in ps[1:]]
            one = "yes" if same and all(s is True for s in same) else \
                "no model" if all(s is None for s in same) else \
                "NO (%s)" % ", ".join("p%d" % (k + 1) for k, s in enumerate(same) if s is not True)
        else:
            mb, share, one = "0", "-", "-"
        shares = "/".join("%.0f%%" % (100 * i["samples"] / tot) for i in ps)
        top1 = fmt(r["final_top1"], "%.2f") + "%"
        fp = list(r["final_peers"].values())
        if len(fp) > 1:
            top1 += " (%.2f-%.2f)" % (min(fp), max(fp))
        rows.append("| %s%s | %s | %d | %d | %d | %.0f s | %s | %s | %s | %s | %s/%s |" % (
            r["config"], " (FAILED: time limit)" if r["failed"] else
            "" if all(i["exit"] == 0 for i in ps) else
            " (exit %s)" % "/".join(str(i["exit"]) for i in ps), top1,
            r["samples"], r["local_samples"], r["steps"], r["wall_s"], mb, share, shares, one,
            fmt(r["load_mean"]), fmt(r["load_max"])))
    return "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--doc", required=True)
    ap.add_argument("--target", type=int, required=True)
    ap.add_argument("--peer-batch", type=int, required=True)
    ap.add_argument("--print-freq", type=int, required=True)
    ap.add_argument("--train-size", type=int, required=True)
    ap.add_argument("--configs", nargs="+", required=True)
    a = ap.parse_args()
    load = []
    for line in read(os.path.join(a.out, "load.txt")).splitlines():
        f = line.split()
        if len(f) >= 2:
            load.append((float(f[0]), float(f[1])))
    results = [r for r in (analyse(a.out, c, a, load) for c in a.configs) if r]
    if not results:
        sys.exit("swarm_plot.py: no runs under %s" % a.out)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(table(results, a))
    sys.stdout.write(table(results, a))
    plot_acc(results, a, 0, "training samples processed (all processes together)",
             os.path.join(a.doc, "swarm_acc_vs_samples.png"),
             "Test top-1 vs samples: periodic evaluations (peer 0), local epoch ends, final model")
    plot_acc(results, a, 1, "wall time (s; every process on one 2-core machine)",
             os.path.join(a.doc, "swarm_acc_vs_time.png"), "Test top-1 vs wall time")
    plot_loss(results, a, os.path.join(a.doc, "swarm_loss.png"))
    plot_compression(results, a, os.path.join(a.doc, "swarm_compression.png"))


if __name__ == "__main__":
    main()
