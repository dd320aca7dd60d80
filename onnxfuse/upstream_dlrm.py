"""The DLRM its users have (issue 33): a re-implementation (written for onnxfuse, no code copied) of the forward pass
of the original DLRM,
`DLRM_Net` in facebookresearch/dlrm's dlrm_s_pytorch.py, single-device path:

  * bottom and top MLPs: nn.Sequential of nn.Linear + ReLU, the top one ending in a Sigmoid (DLRM_Net.create_mlp
    with sigmoid_top = its last layer);
  * one nn.EmbeddingBag(n, m, mode="sum") per sparse feature, looked up with (indices, offsets) per feature:
    multi-hot bags (DLRM_Net.apply_emb without per-sample weights or quantisation);
  * interact_features: "dot" as DLRM_Net spells it (T = cat([x] + ly, 1).view((batch, -1, d)); Z = bmm(T, T^T);
    li / lj built by list comprehensions with offset 1 when arch_interaction_itself else 0; Zflat = Z[:, li, lj];
    R = cat([x] + [Zflat], 1)), or "cat" (R = cat([x] + ly, 1));
  * forward(dense_x, lS_o, lS_i) with lS_o [features, batch] and lS_i [features, n] stacked tensors, the layout
    the repository's Criteo loaders produce and its --save-onnx export takes; or lS_o / lS_i as lists of one tensor
    per table ([batch] offsets, indices of the table's own length: the form its users' own pipelines pass whenever
    the tables' lookups differ in length), which the export turns into one offsets_i / indices_i input pair per
    table.

It was checked once that the real DLRM_Net exports to the same ONNX spelling as this module (see the README); the
spelling is what onnxfuse's rule reads, so the tests and the bench case `dlrm-upstream` (export_torchscript at the
repository's opset 11, which fuse upgrades) run on this module and never import the repository.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _mlp(sizes: list[int], sigmoid_last: bool, g: torch.Generator) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n, m) in enumerate(zip(sizes[:-1], sizes[1:])):
        lin = nn.Linear(n, m, bias=True)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(m, n, generator=g) * math.sqrt(2.0 / (m + n)))
            lin.bias.copy_(torch.randn(m, generator=g) * math.sqrt(1.0 / m))
        layers.append(lin)
        layers.append(nn.Sigmoid() if sigmoid_last and i == len(sizes) - 2 else nn.ReLU())
    return nn.Sequential(*layers)


class OriginalDLRM(nn.Module):
    def __init__(self, m_spa: int, ln_emb: list[int], ln_bot: list[int], ln_top: list[int], interaction: str = "dot",
                 interaction_itself: bool = False, mode: str = "sum", seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.interaction = interaction
        self.interaction_itself = interaction_itself
        self.emb_l = nn.ModuleList()
        for n in ln_emb:
            bag = nn.EmbeddingBag(n, m_spa, mode=mode)
            with torch.no_grad():
                bag.weight.copy_((torch.rand(n, m_spa, generator=g) * 2 - 1) * math.sqrt(1.0 / n))
            self.emb_l.append(bag)
        self.bot_l = _mlp(ln_bot, False, g)
        self.top_l = _mlp(ln_top, True, g)

    def apply_emb(self, lS_o, lS_i):
        # iterating over the stacked indices (not lS_i[k]) is what the original does: TorchScript then splits them
        ly = []
        for k, indices in enumerate(lS_i):
            ly.append(self.emb_l[k](indices, lS_o[k]))
        return ly

    def interact_features(self, x, ly):
        if self.interaction == "dot":
            (batch_size, d) = x.shape
            T = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
            Z = torch.bmm(T, torch.transpose(T, 1, 2))
            _, ni, nj = Z.shape
            offset = 1 if self.interaction_itself else 0
            li = torch.tensor([i for i in range(ni) for j in range(i + offset)])
            lj = torch.tensor([j for i in range(nj) for j in range(i + offset)])
            Zflat = Z[:, li, lj]
            return torch.cat([x] + [Zflat], dim=1)
        return torch.cat([x] + ly, dim=1)

    def forward(self, dense_x, lS_o, lS_i):
        x = self.bot_l(dense_x)
        ly = self.apply_emb(lS_o, lS_i)
        z = self.interact_features(x, ly)
        return self.top_l(z)


def top_width(m_spa: int, n_features: int, interaction: str, itself: bool = False) -> int:
    n = n_features + 1
    return m_spa + (n * (n + 1) // 2 if itself else n * (n - 1) // 2) if interaction == "dot" else n * m_spa


# Bag lengths cycled over the samples (multi-hot and empty bags): the bench cases' and `export dlrm --layout
# upstream*`'s example batches.
BAGS = (1, 2, 0, 3)


def make_batch(ln_emb: list[int], batch: int, bag_lengths: list[int], seed: int = 0, num_dense: int = 13):
    """dense [batch, num_dense], offsets [features, batch] and indices [features, N] with the same bag lengths for
    every feature (so the indices stack), some bags empty; indices within each table."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([bag_lengths[b % len(bag_lengths)] for b in range(batch)])
    offsets = torch.cumsum(lengths, 0) - lengths
    n = int(lengths.sum())
    indices = torch.stack([torch.randint(0, size, (n,), generator=g) for size in ln_emb])
    dense = torch.randn(batch, num_dense, generator=g)
    return dense, offsets.repeat(len(ln_emb), 1), indices


def make_lists(ln_emb: list[int], batch: int, bag_lengths: list[int], seed: int = 0, num_dense: int = 13):
    """dense [batch, 13] and lists lS_o, lS_i of one tensor per table: table f's bag lengths are the pattern shifted
    by f, and its first bag holds f more ids (a long bag), so every table's indices have their own length; some bags
    are empty where the pattern has a 0."""
    g = torch.Generator().manual_seed(seed)
    lS_o, lS_i = [], []
    for f, size in enumerate(ln_emb):
        lengths = torch.tensor([bag_lengths[(b + f) % len(bag_lengths)] + (f if b == 0 else 0) for b in range(batch)])
        lS_o.append(torch.cumsum(lengths, 0) - lengths)
        lS_i.append(torch.randint(0, size, (int(lengths.sum()),), generator=g))
    return torch.randn(batch, num_dense, generator=g), lS_o, lS_i


class ListsCall(nn.Module):
    """`module` called with the per-table export's inputs in order (dense_x, offsets_0.., indices_0..), as
    forward(dense_x, lS_o, lS_i) with lists: what a caller that feeds tensors by position (the bench) needs."""

    def __init__(self, module: OriginalDLRM):
        super().__init__()
        self.module = module

    def forward(self, dense_x, *tensors):
        n = len(tensors) // 2
        return self.module(dense_x, list(tensors[:n]), list(tensors[n:]))


def list_input_names(n_tables: int) -> list[str]:
    """The per-table export's inputs: dense_x, offsets_0.., indices_0.. (the order of forward's flattened lists)."""
    return ["dense_x", *[f"offsets_{f}" for f in range(n_tables)], *[f"indices_{f}" for f in range(n_tables)]]


def criteo_module(spec, seed: int = 0, dtype=None) -> OriginalDLRM:
    """The module at a zoo.DlrmSpec's shapes (its capped tables, bottom and top MLPs, dot or cat), in `dtype`."""
    top_in = top_width(spec.embedding_dim, len(spec.table_sizes), spec.interaction)
    module = OriginalDLRM(spec.embedding_dim, list(spec.table_sizes), [spec.num_dense, *spec.bottom_mlp],
                          [top_in, *spec.top_mlp], spec.interaction, seed=seed).eval()
    return module.to(dtype) if dtype is not None else module


def dynamic_axes(n_tables: int | None) -> dict:
    """The repository's dynamic axes (with the indices' own names): stacked (n_tables None) or one pair per table."""
    if n_tables is None:
        return {"dense_x": {0: "batch_size"}, "offsets": {1: "batch_size"}, "indices": {1: "n_indices"},
                "pred": {0: "batch_size"}}
    return {"dense_x": {0: "batch_size"}, "pred": {0: "batch_size"},
            **{f"offsets_{f}": {0: "batch_size"} for f in range(n_tables)},
            **{f"indices_{f}": {0: f"n_indices_{f}"} for f in range(n_tables)}}


def export_torchscript(module: OriginalDLRM, batch, path, opset: int = 18, dynamic: bool = True) -> None:
    """The repository's --save-onnx export (dynamo=False, its input names and dynamic axes) at opset 18, except that
    the indices' dynamic axis gets its own name: the repository calls it batch_size too, which only holds for one id
    per bag (multi-hot bags have more indices than samples, and onnxruntime trusts equal names). A batch of lists
    (make_lists) exports one offsets_i / indices_i pair per table (list_input_names), each indices tensor with its
    own dynamic length; `dynamic=False` keeps every shape static."""
    dense, offsets, indices = batch
    if isinstance(indices, (list, tuple)):
        n = len(indices)
        torch.onnx.export(module, (dense, list(offsets), list(indices)), str(path), opset_version=opset,
                          input_names=list_input_names(n), output_names=["pred"],
                          dynamic_axes=dynamic_axes(n) if dynamic else None, dynamo=False)
        return
    torch.onnx.export(module, (dense, offsets, indices), str(path), opset_version=opset,
                      input_names=["dense_x", "offsets", "indices"], output_names=["pred"],
                      dynamic_axes=dynamic_axes(None) if dynamic else None, dynamo=False)
