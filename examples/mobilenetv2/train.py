"""Train the MobileNetV2 example: a width-0.25 MobileNetV2 on the digits, upsampled to 64x64 RGB.

The model has the real MobileNetV2 structure (depthwise/pointwise convolutions, inverted
residuals with residual Adds, ReLU6 as Clip(0, 6), BatchNormalization left in the graph,
GlobalAveragePool, Gemm) and takes `input` of shape [1, 3, height, width], so it can be
benchmarked at 224x224 as well as at the 64x64 it was trained on. The data is real handwriting
(scikit-learn's bundled digits); the training is brief: this model exists for speed work.

Writes, next to this file: mobilenetv2.onnx, calib.npz, heldout.npz, heldout_labels.npy and
mobilenetv2.edgekit.toml. Needs PyTorch, which edgekit itself does not use (a throwaway venv):

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 onnx onnxruntime scikit-learn numpy
    /tmp/torchvenv/bin/python examples/mobilenetv2/train.py

Seeded and single-threaded: the same torch build writes the same files byte for byte.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from torch import nn

HERE = Path(__file__).resolve().parent
SEED = 0
SIZE = 64
N_HELDOUT = 100
N_CALIB = 64
WIDTH = 0.25
OPSET = 13
# MobileNetV2's inverted-residual settings: expansion t, channels c, repeats n, first stride s.
SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
# torchvision keeps 1280 below width 1.0; scaling it with the width too keeps the file small
# (at 1280 the last conv and the classifier would be nearly half of all parameters).
LAST_CHANNEL = 256

SIDECAR = """\
# Data that goes with mobilenetv2.onnx; `edgekit deploy/quantize` use it when no flag overrides.
# The model takes any height/width; its data (and this shape) is the 64x64 it was trained on.
[calibration]
data = "calib.npz"

[evaluation]
data = "heldout.npz"
labels = "heldout_labels.npy"

[inputs.input]
shape = [1, 3, 64, 64]
"""


def preprocess(images: np.ndarray) -> np.ndarray:
    """[N,8,8] pixels 0..16 -> float32 [N,3,64,64] in [-1,1]: bilinear upsample, gray -> 3 channels.

    Rounded to multiples of 1/128, the 8-bit precision a camera delivers: such floats end in two
    zero bytes, so the committed npz files compress to two thirds of the size.
    """
    x = torch.from_numpy((images / 16.0).astype(np.float32))[:, None]
    x = nn.functional.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    x = torch.round((x - 0.5) / 0.5 * 128) / 128
    return x.repeat(1, 3, 1, 1).contiguous().numpy()


def split_digits(seed: int = SEED) -> dict[str, np.ndarray]:
    """The same split as examples/digits (360 held-out, never trained on); this model evaluates on 100 of them."""
    digits = load_digits()
    x, y = preprocess(digits.images), digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    heldout, train = order[:360], order[360:]
    calib = rng.choice(train, size=N_CALIB, replace=False)
    heldout = heldout[:N_HELDOUT]
    return {
        "x_train": x[train], "y_train": y[train],
        "x_calib": x[calib],
        "x_heldout": x[heldout], "y_heldout": y[heldout],
    }


def divisible(v: float, d: int = 8) -> int:
    """torchvision's _make_divisible: round channels to a multiple of 8, never down by more than 10%."""
    new = max(d, int(v + d / 2) // d * d)
    return new + d if new < 0.9 * v else new


class ConvBN(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, relu6: bool = True) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if relu6:
            layers.append(nn.ReLU6())
        super().__init__(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(ConvBN(cin, hidden, 1))
        layers += [ConvBN(hidden, hidden, 3, stride, groups=hidden), ConvBN(hidden, cout, 1, relu6=False)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, width: float = WIDTH, classes: int = 10) -> None:
        super().__init__()
        cin = divisible(32 * width)
        last = divisible(LAST_CHANNEL)
        blocks: list[nn.Module] = [ConvBN(3, cin, 3, stride=2)]
        for t, c, n, s in SETTINGS:
            cout = divisible(c * width)
            for i in range(n):
                blocks.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        blocks.append(ConvBN(cin, last, 1))
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Linear(last, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random translation by up to 6 pixels (replicating the border): cheap and enough for digits."""
    padded = nn.functional.pad(x, (6, 6, 6, 6), mode="replicate")
    dy, dx = torch.randint(0, 13, (2,), generator=gen).tolist()
    return padded[:, :, dy:dy + SIZE, dx:dx + SIZE]


def train(data: dict[str, np.ndarray], epochs: int) -> MobileNetV2:
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = MobileNetV2()
    x, y = torch.from_numpy(data["x_train"]), torch.from_numpy(data["y_train"])
    batch = 64
    steps = epochs * ((len(x) + batch - 1) // batch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(len(x), generator=gen)
        total = 0.0
        for i in range(0, len(x), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            loss = loss_fn(model(augment(x[idx], gen)), y[idx])
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss) * len(idx)
        print(f"epoch {epoch + 1}/{epochs}: loss {total / len(x):.4f}")
    return model.eval()


class OnnxWriter:
    """Turns the trained modules into ONNX nodes; names follow the torch state-dict keys."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def weight(self, name: str, t: torch.Tensor | np.ndarray) -> str:
        arr = t.detach().numpy() if isinstance(t, torch.Tensor) else t
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name))
        return name

    def node(self, op: str, ins: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, ins, [name], name=name, **attrs))
        return name

    def conv_bn(self, prefix: str, src: str, m: ConvBN) -> str:
        conv, bn = m[0], m[1]
        k = conv.kernel_size[0]
        t = self.node(
            "Conv", [src, self.weight(f"{prefix}.0.weight", conv.weight)], f"{prefix}.0",
            kernel_shape=[k, k], strides=list(conv.stride), pads=[conv.padding[0]] * 4, group=conv.groups,
        )
        params = [self.weight(f"{prefix}.1.{p}", getattr(bn, p)) for p in ("weight", "bias", "running_mean", "running_var")]
        t = self.node("BatchNormalization", [t, *params], f"{prefix}.1", epsilon=bn.eps)
        if len(m) == 3:
            t = self.node("Clip", [t, "relu6.min", "relu6.max"], f"{prefix}.2")
        return t

    def model(self, net: MobileNetV2) -> onnx.ModelProto:
        self.weight("relu6.min", np.array(0.0))
        self.weight("relu6.max", np.array(6.0))
        t = "input"
        for i, block in enumerate(net.features):
            prefix = f"features.{i}"
            if isinstance(block, ConvBN):
                t = self.conv_bn(prefix, t, block)
                continue
            src = t
            for j, sub in enumerate(block.conv):
                t = self.conv_bn(f"{prefix}.conv.{j}", t, sub)
            if block.residual:
                t = self.node("Add", [src, t], f"{prefix}.add")
        t = self.node("GlobalAveragePool", [t], "pool")
        t = self.node("Flatten", [t], "flatten", axis=1)
        self.nodes.append(helper.make_node(
            "Gemm", [t, self.weight("classifier.weight", net.classifier.weight), self.weight("classifier.bias", net.classifier.bias)],
            ["logits"], name="classifier", transB=1,
        ))
        graph = helper.make_graph(
            self.nodes, "mobilenetv2_025",
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "height", "width"])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
            initializer=self.inits,
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edgekit-examples")
        m.ir_version = 8  # readable by every onnxruntime edgekit supports (>= 1.17)
        m.doc_string = (
            "MobileNetV2 width 0.25 (last conv 256), 10 classes (digits upsampled to 64x64, 3 channels, (x/16-0.5)/0.5 rounded to 1/128). "
            "Input height/width are free; trained at 64x64."
        )
        onnx.checker.check_model(m, full_check=True)
        return m


def verify(model: MobileNetV2, proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """ORT logits must equal torch's (atol 1e-4), also at 224x224; returns ORT's logits for x."""
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = np.concatenate([sess.run(None, {"input": x[i:i + 1]})[0] for i in range(len(x))])
    big = np.random.default_rng(SEED).uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
        want_big = model(torch.from_numpy(big)).numpy()
    err = float(np.abs(got - want).max())
    err_big = float(np.abs(sess.run(None, {"input": big})[0] - want_big).max())
    if max(err, err_big) > 1e-4:
        raise SystemExit(f"ONNX Runtime disagrees with torch: max abs error {err:.2e} (64x64), {err_big:.2e} (224x224)")
    print(f"ORT vs torch: max abs error {err:.2e} at 64x64, {err_big:.2e} at 224x224")
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE, help="output directory (default: next to this script)")
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)  # deterministic reductions

    data = split_digits()
    model = train(data, args.epochs)
    proto = OnnxWriter().model(model)
    logits = verify(model, proto, data["x_heldout"])
    correct = int((logits.argmax(1) == data["y_heldout"]).sum())
    print(f"fp32 held-out accuracy: {correct / N_HELDOUT:.1%} ({correct}/{N_HELDOUT})")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, out / "mobilenetv2.onnx")
    # Compressed: the three channels are equal and the images smooth, so this keeps the repo small.
    np.savez_compressed(out / "calib.npz", input=data["x_calib"])
    np.savez_compressed(out / "heldout.npz", input=data["x_heldout"])
    np.save(out / "heldout_labels.npy", data["y_heldout"])
    (out / "mobilenetv2.edgekit.toml").write_text(SIDECAR)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
