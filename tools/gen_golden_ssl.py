#!/usr/bin/python3
"""gen_golden_ssl.py: PyTorch references for the self-supervised pieces.

Run with Debian's PyTorch (torch 1.13):
    /usr/bin/python3 tools/gen_golden_ssl.py      # writes tests/golden/ssl.safetensors

Read by tests/test_ssl.c. Inputs are float32; references are computed in
float64 and stored as float32. The formulas are the reference SSL library's
(lightly 1.4, written out here so this script needs only torch):
  norm.*     F.normalize(x, dim=1) forward, and its backward for a given dy
  infonce.*  NTXentLoss with a memory bank: q, k normalized rows, bank rows
             (the library keeps the bank as [D, K]; stored here as [K, D]),
             logits = cat([q.k, q @ bank^T]) / t, cross-entropy to label 0,
             mean; the gradient w.r.t. q
  ntxent.*   NTXentLoss without a bank, one process: z0, z1 normalized,
             logits_00 / logits_11 without their diagonal, labels arange,
             cross-entropy over cat([cat([l01, l00]), cat([l10, l11])]);
             gradients w.r.t. z0 and z1
  moco_head.* / simclr_head.*  MoCoProjectionHead (Linear-ReLU-Linear) and
             SimCLRProjectionHead (Linear no bias - BatchNorm1d - ReLU -
             Linear) in train mode: weights, input, output, the gradients
             of sum(out * g) for a given g, and the BatchNorm's running
             statistics after the step
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import OUT_DIR, f32, save_safetensors  # noqa: E402

D64 = torch.float64


def main():
    torch.manual_seed(11)
    out = {}

    def leaf(t):
        return t.detach().to(D64).requires_grad_(True)

    # ---- F.normalize ----
    x = torch.randn(6, 8) * 3
    dy = torch.randn(6, 8)
    xl = leaf(x)
    y = F.normalize(xl, dim=1)
    y.backward(dy.to(D64))
    out.update({"norm.x": f32(x), "norm.dy": f32(dy), "norm.y": f32(y), "norm.dx": f32(xl.grad)})

    # ---- InfoNCE against a memory bank ----
    n, d, K, t = 6, 8, 20, 0.2
    q = F.normalize(torch.randn(n, d), dim=1)
    k = F.normalize(q + 0.5 * torch.randn(n, d), dim=1)
    bank = F.normalize(torch.randn(K, d), dim=1)
    ql = leaf(q)
    sim_pos = torch.einsum("nc,nc->n", ql, k.to(D64)).unsqueeze(-1) / t
    sim_neg = ql @ bank.to(D64).T / t
    logits = torch.cat([sim_pos, sim_neg], dim=1)
    loss = F.cross_entropy(logits, torch.zeros(n, dtype=torch.long))
    loss.backward()
    out.update({"infonce.q": f32(q), "infonce.k": f32(k), "infonce.bank": f32(bank),
                "infonce.loss": f32(loss.reshape(1)), "infonce.dq": f32(ql.grad)})

    # ---- NT-Xent, one process ----
    n, d, t = 5, 8, 0.1
    z0 = F.normalize(torch.randn(n, d), dim=1)
    z1 = F.normalize(z0 + 0.7 * torch.randn(n, d), dim=1)
    a, b = leaf(z0), leaf(z1)
    diag = torch.eye(n, dtype=torch.bool)
    l00 = a @ a.T / t
    l01 = a @ b.T / t
    l10 = b @ a.T / t
    l11 = b @ b.T / t
    l00 = l00[~diag].view(n, -1)
    l11 = l11[~diag].view(n, -1)
    logits = torch.cat([torch.cat([l01, l00], dim=1), torch.cat([l10, l11], dim=1)], dim=0)
    labels = torch.arange(n).repeat(2)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    out.update({"ntxent.z0": f32(z0), "ntxent.z1": f32(z1), "ntxent.loss": f32(loss.reshape(1)),
                "ntxent.dz0": f32(a.grad), "ntxent.dz1": f32(b.grad)})

    # ---- projection heads (train mode) ----
    def head_case(name, bn):
        fin, hid, fout, batch = 12, 10, 6, 4
        l1 = nn.Linear(fin, hid, bias=not bn).to(D64)
        l2 = nn.Linear(hid, fout).to(D64)
        layers = [l1] + ([nn.BatchNorm1d(hid).to(D64)] if bn else []) + [nn.ReLU(), l2]
        head = nn.Sequential(*layers).train()
        if bn:  # not the trivial gamma = 1, beta = 0
            with torch.no_grad():
                layers[1].weight.copy_(1 + 0.3 * torch.randn(hid))
                layers[1].bias.copy_(0.2 * torch.randn(hid))
        xin = torch.randn(batch, fin)
        g = torch.randn(batch, fout)
        xl = leaf(xin)
        o = head(xl)
        (o * g.to(D64)).sum().backward()
        last = 3 if bn else 2
        r = {f"{name}.x": f32(xin), f"{name}.g": f32(g), f"{name}.out": f32(o),
             f"{name}.dx": f32(xl.grad),
             f"{name}.layers.0.weight": f32(l1.weight), f"{name}.grad.layers.0.weight": f32(l1.weight.grad),
             f"{name}.layers.{last}.weight": f32(l2.weight),
             f"{name}.grad.layers.{last}.weight": f32(l2.weight.grad),
             f"{name}.layers.{last}.bias": f32(l2.bias),
             f"{name}.grad.layers.{last}.bias": f32(l2.bias.grad)}
        if bn:
            bnl = layers[1]
            r.update({f"{name}.layers.1.weight": f32(bnl.weight), f"{name}.layers.1.bias": f32(bnl.bias),
                      f"{name}.grad.layers.1.weight": f32(bnl.weight.grad),
                      f"{name}.grad.layers.1.bias": f32(bnl.bias.grad),
                      f"{name}.layers.1.running_mean": f32(bnl.running_mean),
                      f"{name}.layers.1.running_var": f32(bnl.running_var)})
        else:
            r.update({f"{name}.layers.0.bias": f32(l1.bias), f"{name}.grad.layers.0.bias": f32(l1.bias.grad)})
        return r

    out.update(head_case("moco_head", False))
    out.update(head_case("simclr_head", True))
    path = os.path.join(OUT_DIR, "ssl.safetensors")
    save_safetensors(path, out)
    print(f"wrote {path} ({len(out)} tensors)")


if __name__ == "__main__":
    main()
