#!/usr/bin/python3
"""Writes tests/golden/optim_golden.h: reference results for the optim module.

Run with Debian's Python (torch 1.13) and timm installed:
    /usr/bin/python3 -m pip install --break-system-packages 'timm==0.9.16'
    /usr/bin/python3 tools/gen_golden_optim.py

The optimizers run on a small table of four tensors, two of them flagged
VISC_TENSOR_NO_DECAY, for five steps with changing gradients and lr; the
header holds the initial parameters, the gradients and the parameters after
every step. Every hyperparameter is a float32 value, so the C side (float
config) and the Python side (double scalars) start from the same numbers.
Torch's param groups mirror visc's exclusion rule: tensors flagged no-decay
go into a group with weight_decay 0 unless decay_norm_and_bias is set.
It also records torch lr schedulers, timm's ModelEmaV2 and clip_grad_norm_."""
import math
import os
import re

import numpy as np
import torch
from timm.optim.lamb import Lamb
from timm.optim.lars import Lars
from timm.utils.model_ema import ModelEmaV2

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden", "optim_golden.h")
STEPS = 5


def f32(x):
    return float(np.float32(x))


TENSORS = [  # name, shape, flags
    ("conv.weight", (2, 3, 2, 2), "0"),
    ("bn.weight", (16,), "VISC_TENSOR_NO_DECAY | VISC_TENSOR_NORM"),
    ("fc.weight", (3, 10), "0"),
    ("fc.bias", (10,), "VISC_TENSOR_NO_DECAY | VISC_TENSOR_BIAS"),
]

g = torch.Generator().manual_seed(1234)
INIT = []
for name, shape, _ in TENSORS:
    t = torch.randn(shape, generator=g) * 0.5
    if name == "bn.weight":
        t = 1.0 + 0.1 * t
    INIT.append(t)
# Gradient scales vary so LAMB's global clipping (max_grad_norm 1) is active on
# some steps and not on others; conv.weight's gradient is zero on step 2 so the
# zero-norm branches of the trust ratios run.
SCALES = [1.0, 0.03, 2.0, 0.01, 0.5]
GRADS = []
for s, scale in enumerate(SCALES):
    step = []
    for (name, shape, _) in TENSORS:
        t = torch.randn(shape, generator=g) * scale
        if s == 2 and name == "conv.weight":
            t.zero_()
        step.append(t)
    GRADS.append(step)
LR_FACTORS = [1.0, 0.8, 0.5, 1.2, 0.3]

CASES = [
    dict(name="sgd_plain", kind="sgd", lr=0.1, momentum=0.0, weight_decay=0.0),
    dict(name="sgd_momentum", kind="sgd", lr=0.1, momentum=0.9, weight_decay=0.0),
    dict(name="sgd_momentum_wd", kind="sgd", lr=0.1, momentum=0.9, weight_decay=0.05),
    dict(name="sgd_nesterov_wd", kind="sgd", lr=0.1, momentum=0.9, nesterov=1, weight_decay=0.05),
    dict(name="sgd_wd_all", kind="sgd", lr=0.1, momentum=0.9, weight_decay=0.05, decay_norm_and_bias=1),
    dict(name="adamw", kind="adamw", lr=0.01, weight_decay=0.05),
    dict(name="adamw_all", kind="adamw", lr=0.01, weight_decay=0.05, beta1=0.8, beta2=0.99, eps=1e-6,
         decay_norm_and_bias=1),
    dict(name="lamb", kind="lamb", lr=0.01, weight_decay=0.02, eps=1e-6),
    dict(name="lamb_all_noclip", kind="lamb", lr=0.01, weight_decay=0.02, eps=1e-6, decay_norm_and_bias=1,
         max_grad_norm=0.0),
    dict(name="lamb_trust_clip", kind="lamb", lr=0.01, weight_decay=0.02, eps=1e-6, always_adapt=1,
         trust_clip=1, max_grad_norm=2.0),
    dict(name="lars", kind="lars", lr=0.5, momentum=0.9, weight_decay=0.05),
    dict(name="lars_nesterov_always", kind="lars", lr=0.5, momentum=0.9, nesterov=1, weight_decay=0.05,
         always_adapt=1),
    dict(name="lars_trust_clip", kind="lars", lr=0.5, momentum=0.0, weight_decay=0.05, trust_clip=1,
         trust_coef=0.02),
]
DEFAULTS = dict(momentum=0.0, nesterov=0, weight_decay=0.0, beta1=0.9, beta2=0.999, eps=1e-8, trust_coef=0.001,
                decay_norm_and_bias=0, max_grad_norm=1.0, always_adapt=0, trust_clip=0)


def run_case(c):
    c = {**DEFAULTS, **c}
    for k in ("lr", "momentum", "weight_decay", "beta1", "beta2", "eps", "trust_coef", "max_grad_norm"):
        c[k] = f32(c[k])
    params = [t.clone().requires_grad_(True) for t in INIT]
    decay, no_decay = [], []
    for p, (_, _, flags) in zip(params, TENSORS):
        (no_decay if "NO_DECAY" in flags and not c["decay_norm_and_bias"] else decay).append(p)
    groups = [dict(params=decay), dict(params=no_decay, weight_decay=0.0)]
    groups = [gr for gr in groups if gr["params"]]
    if c["kind"] == "sgd":
        opt = torch.optim.SGD(groups, lr=c["lr"], momentum=c["momentum"], nesterov=bool(c["nesterov"]),
                              weight_decay=c["weight_decay"])
    elif c["kind"] == "adamw":
        opt = torch.optim.AdamW(groups, lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                                weight_decay=c["weight_decay"])
    elif c["kind"] == "lamb":
        # visc's max_grad_norm <= 0 turns clipping off; timm needs a number.
        mgn = c["max_grad_norm"] if c["max_grad_norm"] > 0 else 1e30
        opt = Lamb(groups, lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                   weight_decay=c["weight_decay"], max_grad_norm=mgn, always_adapt=bool(c["always_adapt"]),
                   trust_clip=bool(c["trust_clip"]))
    else:
        opt = Lars(groups, lr=c["lr"], momentum=c["momentum"], nesterov=bool(c["nesterov"]),
                   weight_decay=c["weight_decay"], trust_coeff=c["trust_coef"], eps=c["eps"],
                   always_adapt=bool(c["always_adapt"]), trust_clip=bool(c["trust_clip"]))
    lrs, expect = [], []
    for s in range(STEPS):
        lr = f32(c["lr"] * LR_FACTORS[s])
        lrs.append(lr)
        for gr in opt.param_groups:
            gr["lr"] = lr
        for p, gt in zip(params, GRADS[s]):
            p.grad = gt.clone()
        opt.step()
        expect.append(flat(params))
    c["lrs"] = lrs
    c["expect"] = expect
    return c


def flat(ts):
    return torch.cat([t.detach().reshape(-1) for t in ts]).tolist()


def lr_trace(sched_factory, base, n):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base, momentum=0.9)
    sched = sched_factory(opt)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def warmup_then(main_factory, base, warmup, start, total):
    """torch's LinearLR for the warmup steps, then the main scheduler from its
    own step 0 (what SequentialLR means), through step `total` inclusive."""
    lrs = []
    if warmup:
        lrs = lr_trace(lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=start, total_iters=warmup),
                       base, warmup)
    return lrs + lr_trace(main_factory, base, total - warmup + 1)


L = torch.optim.lr_scheduler
SCHEDS = []


def sched(name, kind, base, total, lrs, min_lr=0.0, warmup=0, warmup_start=0.0, step_size=0, gamma=0.0,
          milestones=()):
    SCHEDS.append(dict(name=name, kind=kind, base=f32(base), min_lr=f32(min_lr), total=total, warmup=warmup,
                       warmup_start=f32(warmup_start), step_size=step_size, gamma=f32(gamma),
                       milestones=list(milestones), lrs=lrs))


B, MIN, G = f32(0.1), f32(0.001), f32(0.5)
sched("step", "VISC_SCHED_STEP", B, 30, lr_trace(lambda o: L.StepLR(o, step_size=7, gamma=G), B, 31),
      step_size=7, gamma=G)
G3 = f32(0.3)
sched("multistep", "VISC_SCHED_MULTISTEP", B, 30,
      lr_trace(lambda o: L.MultiStepLR(o, milestones=[5, 12, 12, 20], gamma=G3), B, 31), gamma=G3,
      milestones=[5, 12, 12, 20])
sched("cosine", "VISC_SCHED_COSINE", B, 40, lr_trace(lambda o: L.CosineAnnealingLR(o, T_max=40, eta_min=MIN), B, 41),
      min_lr=MIN)
WS = f32(0.01)
sched("cosine_warmup", "VISC_SCHED_COSINE", B, 40,
      warmup_then(lambda o: L.CosineAnnealingLR(o, T_max=35, eta_min=MIN), B, 5, WS, 40), min_lr=MIN, warmup=5,
      warmup_start=WS)
sched("multistep_warmup", "VISC_SCHED_MULTISTEP", B, 30,
      warmup_then(lambda o: L.MultiStepLR(o, milestones=[4, 9], gamma=G3), B, 3, f32(0.25), 30), warmup=3,
      warmup_start=f32(0.25), gamma=G3, milestones=[4, 9])
sched("step_warmup", "VISC_SCHED_STEP", B, 20,
      warmup_then(lambda o: L.StepLR(o, step_size=4, gamma=G), B, 2, f32(0.5), 20), warmup=2,
      warmup_start=f32(0.5), step_size=4, gamma=G)
# ONECYCLE as torch's OneCycleLR(anneal_strategy='linear', two phases): it
# starts at max_lr / div_factor, peaks after pct_start * total_steps - 1
# steps and ends at initial_lr / final_div_factor on its last step
# (total_steps - 1); visc counts its total inclusively, hence the + 1s.
W1, T1, S1, M1 = 10, 50, f32(0.04), f32(1e-4)
sched("onecycle", "VISC_SCHED_ONECYCLE", B, T1,
      lr_trace(lambda o: L.OneCycleLR(o, max_lr=B, total_steps=T1 + 1, pct_start=(W1 + 1) / (T1 + 1),
                                      anneal_strategy="linear", cycle_momentum=False, div_factor=1 / S1,
                                      final_div_factor=S1 * B / M1), B, T1 + 1),
      min_lr=M1, warmup=W1, warmup_start=S1)

# timm's ModelEmaV2 over a one-tensor model, fed the gradient arrays as weights.
EMA_DECAY = f32(0.99)
model = torch.nn.Module()
model.w = torch.nn.Parameter(torch.cat([t.reshape(-1) for t in INIT]).clone())
ema = ModelEmaV2(model, decay=EMA_DECAY)
for s in range(3):
    with torch.no_grad():
        model.w.copy_(torch.cat([t.reshape(-1) for t in GRADS[s]]))
    ema.update(model)
EMA_EXPECT = ema.module.w.detach().tolist()

# clip_grad_norm_ on the four tensors: step 0's gradients get clipped to 5,
# step 1's (norm < 1) are left alone, and step 3's scaled to a norm near 1e-6
# are clipped only because of torch's eps 1e-6.
CLIP = []
for s, max_norm, scale in ((0, 5.0, 1.0), (1, 5.0, 1.0), (3, 1e-6, 1e-5)):
    max_norm, scale = f32(max_norm), f32(scale)
    ps = [t.clone().requires_grad_(True) for t in INIT]
    for p, gt in zip(ps, GRADS[s]):
        p.grad = gt.clone() * scale
    norm = torch.nn.utils.clip_grad_norm_(ps, max_norm)
    CLIP.append(dict(step=s, max_norm=max_norm, scale=scale, norm=float(norm), grads=flat([p.grad for p in ps])))


# Large tensors, so the C side cuts them into several blocks and its
# per-tensor norms are sums over blocks. The values are integer ratios that C
# and Python round identically, so the header holds only the recipe and a
# sample of the result.
LARGE = [("big.weight", 40000, 0), ("big.bias", 100, 1), ("big2.weight", 20000, 0)]  # name, numel, no-decay
LARGE_STEPS = 3
LARGE_SAMPLES = 64


def large_values(n, offset, mul, step):
    i = torch.arange(n, dtype=torch.int64) + offset
    return (((i * mul + 17 * step) % 2001) - 1000).to(torch.float32) / 1000.0


def large_grads(step):
    return [large_values(n, o, 7919 + 31 * step, step) * (1.0 if step != 1 else 0.01)
            for (_, n, _), o in zip(LARGE, large_offsets())]


def large_offsets():
    offs, o = [], 0
    for _, n, _ in LARGE:
        offs.append(o)
        o += n
    return offs


LARGE_CASES = [
    dict(name="lamb_large", kind="lamb", lr=0.01, weight_decay=0.02, eps=1e-6),
    dict(name="lars_large", kind="lars", lr=0.5, momentum=0.9, weight_decay=0.05),
    dict(name="adamw_large", kind="adamw", lr=0.01, weight_decay=0.05),
]


def run_large(c):
    global TENSORS, INIT, GRADS, STEPS
    saved = TENSORS, INIT, GRADS, STEPS
    TENSORS = [(n, (k,), "VISC_TENSOR_NO_DECAY" if nd else "0") for n, k, nd in LARGE]
    INIT = [large_values(k, o, 104729, 0) * 0.5 for (_, k, _), o in zip(LARGE, large_offsets())]
    GRADS = [large_grads(s) for s in range(LARGE_STEPS)]
    STEPS = LARGE_STEPS
    r = run_case(c)
    TENSORS, INIT, GRADS, STEPS = saved
    total = sum(k for _, k, _ in LARGE)
    idx = [(j * 1237 + 5) % total for j in range(LARGE_SAMPLES)]
    final = r["expect"][-1]
    r["idx"] = idx
    r["sample"] = [final[i] for i in idx]
    r["sum"] = float(np.sum(np.array(final, dtype=np.float64)))
    return r


def floats(xs, indent="    "):
    xs = [float(np.float32(x)) for x in xs]
    items = ["%.9g" % x + ("f" if ("." in "%.9g" % x or "e" in "%.9g" % x) else ".0f") for x in xs]
    lines, line = [], indent
    for it in items:
        if len(line) + len(it) + 2 > 110:
            lines.append(line.rstrip())
            line = indent
        line += it + ", "
    lines.append(line.rstrip())
    return "{\n" + "\n".join(lines) + "\n" + indent[:-4] + "}"


def cfg_init(c):
    kinds = dict(sgd="VISC_OPT_SGD", adamw="VISC_OPT_ADAMW", lamb="VISC_OPT_LAMB", lars="VISC_OPT_LARS")
    return ("{.kind = %s, .momentum = %.9gf, .nesterov = %d, .weight_decay = %.9gf, .beta1 = %.9gf, .beta2 = %.9gf,"
            " .eps = %.9gf, .trust_coef = %.9gf, .decay_norm_and_bias = %d, .max_grad_norm = %.9gf,"
            " .always_adapt = %d, .trust_clip = %d}"
            % (kinds[c["kind"]], c["momentum"], c["nesterov"], c["weight_decay"], c["beta1"], c["beta2"], c["eps"],
               c["trust_coef"], c["decay_norm_and_bias"], c["max_grad_norm"], c["always_adapt"], c["trust_clip"]))


def main():
    total = sum(int(np.prod(s)) for _, s, _ in TENSORS)
    o = ["/* optim_golden.h: generated by tools/gen_golden_optim.py (torch %s, timm 0.9.16); do not edit. */"
         % torch.__version__,
         "#ifndef OPTIM_GOLDEN_H", "#define OPTIM_GOLDEN_H", "", "#include <stdint.h>", "",
         '#include "visc/optim.h"', "",
         "#define OG_TENSORS %d" % len(TENSORS), "#define OG_TOTAL %d" % total, "#define OG_STEPS %d" % STEPS, ""]
    o.append("static const char *const og_names[OG_TENSORS] = {%s};" % ", ".join('"%s"' % n for n, _, _ in TENSORS))
    o.append("static const int og_ndim[OG_TENSORS] = {%s};" % ", ".join(str(len(s)) for _, s, _ in TENSORS))
    o.append("static const int64_t og_shape[OG_TENSORS][4] = {%s};" % ", ".join(
        "{%s}" % ", ".join(str(d) for d in s) for _, s, _ in TENSORS))
    o.append("static const unsigned og_flags[OG_TENSORS] = {%s};" % ", ".join(f for _, _, f in TENSORS))
    o.append("")
    o.append("/* Initial parameters, tensors concatenated without padding. */")
    o.append("static const float og_init[OG_TOTAL] = %s;" % floats(flat(INIT)))
    o.append("static const float og_grads[OG_STEPS][OG_TOTAL] = {")
    for s in range(STEPS):
        o.append("    " + floats(flat(GRADS[s]), "        ") + ",")
    o.append("};")
    o.append("")
    o.append("typedef struct {")
    o.append("    const char *name;")
    o.append("    visc_opt_config cfg;")
    o.append("    float lr[OG_STEPS];")
    o.append("    float expect[OG_STEPS][OG_TOTAL]; /* parameters after each step */")
    o.append("} og_case;")
    o.append("")
    o.append("static const og_case og_cases[] = {")
    for c in map(run_case, CASES):
        o.append("    {")
        o.append('        "%s",' % c["name"])
        o.append("        " + cfg_init(c) + ",")
        o.append("        %s," % floats(c["lrs"], "            "))
        o.append("        {")
        for e in c["expect"]:
            o.append("            " + floats(e, "                ") + ",")
        o.append("        },")
        o.append("    },")
    o.append("};")
    o.append("#define OG_CASES ((int)(sizeof og_cases / sizeof og_cases[0]))")
    o.append("")
    o.append("/* Large tensors (several blocks each): parameters and gradients are")
    o.append(" * ((i * mul + 17 * step) %% 2001 - 1000) / 1000 over the concatenated index i,")
    o.append(" * parameters with mul %d, halved; gradients with mul 7919 + 31 * step, times 0.01 on step 1. */" % 104729)
    o.append("#define OG_LARGE_TENSORS %d" % len(LARGE))
    o.append("#define OG_LARGE_STEPS %d" % LARGE_STEPS)
    o.append("#define OG_LARGE_SAMPLES %d" % LARGE_SAMPLES)
    o.append("static const int64_t og_large_numel[OG_LARGE_TENSORS] = {%s};" % ", ".join(str(k) for _, k, _ in LARGE))
    o.append("static const unsigned og_large_flags[OG_LARGE_TENSORS] = {%s};" % ", ".join(
        "VISC_TENSOR_NO_DECAY" if nd else "0" for _, _, nd in LARGE))
    o.append("typedef struct {")
    o.append("    const char *name;")
    o.append("    visc_opt_config cfg;")
    o.append("    float lr[OG_LARGE_STEPS];")
    o.append("    int idx[OG_LARGE_SAMPLES]; /* concatenated indices */")
    o.append("    float sample[OG_LARGE_SAMPLES]; /* parameters there after the last step */")
    o.append("    double sum; /* of all parameters after the last step */")
    o.append("} og_large_case;")
    o.append("static const og_large_case og_large_cases[] = {")
    for c in map(run_large, LARGE_CASES):
        o.append('    {"%s",' % c["name"])
        o.append("     " + cfg_init(c) + ",")
        o.append("     %s," % floats(c["lrs"], "         "))
        o.append("     {%s}," % ", ".join(map(str, c["idx"])))
        o.append("     %s," % floats(c["sample"], "         "))
        o.append("     %.17g}," % c["sum"])
    o.append("};")
    o.append("#define OG_LARGE_CASES ((int)(sizeof og_large_cases / sizeof og_large_cases[0]))")
    o.append("")
    o.append("/* torch lr schedulers: lrs[k] is the lr of step k, for k = 0 .. total_steps. */")
    o.append("typedef struct {")
    o.append("    const char *name;")
    o.append("    visc_schedule s;")
    o.append("    int n;")
    o.append("    const float *lrs;")
    o.append("} og_sched;")
    for i, s in enumerate(SCHEDS):
        o.append("static const float og_sched_lrs_%d[] = %s;" % (i, floats(s["lrs"])))
    o.append("static const og_sched og_scheds[] = {")
    for i, s in enumerate(SCHEDS):
        ms = s["milestones"]
        o.append('    {"%s",' % s["name"])
        o.append("     {.kind = %s, .base_lr = %.9gf, .min_lr = %.9gf, .total_steps = %d, .warmup_steps = %d,"
                 % (s["kind"], s["base"], s["min_lr"], s["total"], s["warmup"]))
        o.append("      .warmup_start = %.9gf, .step_size = %d, .gamma = %.9gf, .milestones = {%s}, .num_milestones = %d},"
                 % (s["warmup_start"], s["step_size"], s["gamma"], ", ".join(map(str, ms)) or "0", len(ms)))
        o.append("     %d, og_sched_lrs_%d}," % (len(s["lrs"]), i))
    o.append("};")
    o.append("#define OG_SCHEDS ((int)(sizeof og_scheds / sizeof og_scheds[0]))")
    o.append("")
    o.append("/* timm ModelEmaV2, decay %.9g: the EMA of og_init after updates with og_grads[0..2]. */" % EMA_DECAY)
    o.append("#define OG_EMA_DECAY %.9gf" % EMA_DECAY)
    o.append("static const float og_ema_expect[OG_TOTAL] = %s;" % floats(EMA_EXPECT))
    o.append("")
    o.append("/* torch.nn.utils.clip_grad_norm_ on og_grads[step] * scale. */")
    o.append("typedef struct {")
    o.append("    int step;")
    o.append("    float scale, max_norm, norm;")
    o.append("    float grads[OG_TOTAL];")
    o.append("} og_clip;")
    o.append("static const og_clip og_clips[] = {")
    for c in CLIP:
        o.append("    {%d, %.9gf, %.9gf, %.9gf, %s}," % (c["step"], c["scale"], c["max_norm"], c["norm"],
                                                       floats(c["grads"], "        ")))
    o.append("};")
    o.append("#define OG_CLIPS ((int)(sizeof og_clips / sizeof og_clips[0]))")
    o.append("")
    o.append("#endif")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    # "%.9gf" prints integral values as "0f", which C reads as no float: make them "0.0f".
    text = re.sub(r"(?<![\w.+-])(-?\d+)f\b", r"\1.0f", "\n".join(o) + "\n")
    with open(OUT, "w") as f:
        f.write(text)
    print("wrote", os.path.normpath(OUT), "(%d cases, %d schedules)" % (len(CASES), len(SCHEDS)))

    # Side check: the closed forms in visc's header against the traces above.
    for s in SCHEDS:
        for k, lr in enumerate(s["lrs"]):
            want = closed_form(s, k)
            assert abs(want - lr) <= 1e-9 + 1e-7 * abs(lr), (s["name"], k, lr, want)


def closed_form(s, k):
    base, w, T = s["base"], s["warmup"], s["total"] - s["warmup"]
    if k < w:
        return base * (s["warmup_start"] + (1 - s["warmup_start"]) * k / w)
    t = k - w
    if s["kind"] == "VISC_SCHED_STEP":
        return base * s["gamma"] ** (t // s["step_size"])
    if s["kind"] == "VISC_SCHED_MULTISTEP":
        return base * s["gamma"] ** sum(m <= t for m in s["milestones"])
    if s["kind"] == "VISC_SCHED_COSINE":
        return s["min_lr"] + (base - s["min_lr"]) * (1 + math.cos(math.pi * t / T)) / 2 if t < T else s["min_lr"]
    return base + (s["min_lr"] - base) * t / T if t < T else s["min_lr"]


if __name__ == "__main__":
    main()
