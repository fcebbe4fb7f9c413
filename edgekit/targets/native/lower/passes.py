"""Passes over the lowered ``EkmModel``, after the walk: prune, flatten-into-FC, memory plan."""

from __future__ import annotations

from collections import Counter

import numpy as np

from edgekit.targets.native import ekm

NHWC = (0, 2, 3, 1)  # stored axis i holds logical (NCHW) axis NHWC[i]


def prune(m: ekm.EkmModel) -> dict[int, int]:
    """Drop ops nothing reads (an intermediate a table folded in) and the tensors only they used;
    returns old tensor index -> new, for the tensors that stay."""
    used = {t for t, _ in m.outputs}
    keep = []
    for op in reversed(m.ops):
        if op.outputs[0] in used:
            keep.append(op)
            used.update(op.inputs)
    m.ops = keep[::-1]
    live = sorted(used | {t for t, _ in m.inputs})
    remap = {old: new for new, old in enumerate(live)}
    m.tensors = [m.tensors[i] for i in live]
    for op in m.ops:
        op.inputs = [remap[i] for i in op.inputs]
        op.outputs = [remap[i] for i in op.outputs]
    m.inputs = [(remap[t], n) for t, n in m.inputs]
    m.outputs = [(remap[t], n) for t, n in m.outputs]
    return remap


def flatten_fc_inputs(m: ekm.EkmModel) -> None:
    """A Flatten of a 4-D NHWC tensor that only feeds fully connected layers needs no reorder:
    permute the weights' columns to NHWC order instead and keep the bytes (order 0)."""
    users: dict[int, list[ekm.Op]] = {}
    for op in m.ops:
        for i in op.inputs:
            users.setdefault(i, []).append(op)
    for op in m.ops:
        if op.type != ekm.RESHAPE or op.params[0] != 1:
            continue
        out = op.outputs[0]
        fcs = users.get(out, [])
        if not fcs or any(u.type != ekm.FULLY_CONNECTED or u.inputs[0] != out for u in fcs):
            continue
        n, h, w, c = m.tensors[op.inputs[0]].dims
        # NHWC flat index j holds the NCHW flat index perm[j]
        perm = np.arange(n * c * h * w).reshape(n, c, h, w).transpose(NHWC).reshape(-1)
        for fc in fcs:
            wt = m.tensors[fc.inputs[1]]
            wt.data = np.ascontiguousarray(wt.data[:, perm])
        op.params[0] = 0


def plan_memory(m: ekm.EkmModel) -> int:
    """Arena offsets for every arena tensor: lifetimes from the op order, greedy by size,
    64-byte aligned, reusing the space of tensors that are dead. Returns the arena size.

    A LUT right after the convolution whose output only it reads is live from that convolution
    on: ekrt folds such a LUT into the convolution, which then writes the LUT's output while it
    still reads its own inputs (docs/ekrt.md), so the two must not share bytes."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    readers = Counter(t for op in m.ops for t in op.inputs)
    for j, op in enumerate(m.ops):
        for t in op.outputs:
            first.setdefault(t, j)
            last[t] = max(last.get(t, j), j)
        for t in op.inputs:
            last[t] = j
        prev = m.ops[j - 1] if j else None
        if (op.type == ekm.LUT and prev is not None and prev.type in (ekm.CONV2D, ekm.FULLY_CONNECTED)
                and op.inputs[0] in prev.outputs and readers[op.inputs[0]] == 1):
            first[op.outputs[0]] = j - 1
    arena = [i for i, t in enumerate(m.tensors) if t.storage == ekm.ARENA]
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    size = 0
    for i in sorted(arena, key=lambda i: (-m.tensors[i].nbytes, first.get(i, 0))):
        t = m.tensors[i]
        lo, hi = first.get(i, 0), last.get(i, first.get(i, 0))
        live = sorted((o, e) for o, e, f, la in placed if not (la < lo or f > hi))
        offset = 0
        for o, e in live:
            if offset + t.nbytes <= o:
                break
            offset = max(offset, ekm.align(e))
        t.offset = offset
        placed.append((offset, offset + t.nbytes, lo, hi))
        size = max(size, ekm.align(offset + t.nbytes))
    m.arena_size = size
    return size
