"""Train the digits example: a small CNN on scikit-learn's bundled handwritten digits.

Writes, next to this file: digits_cnn.onnx, calib.npz, heldout.npz, heldout_labels.npy and
digits_cnn.edgekit.toml. The ONNX graph is written with onnx.helper from the trained weights
(no torch exporter) and checked against torch with ONNX Runtime before anything is saved.

Needs PyTorch, which edgekit itself does not use:

    pip install torch scikit-learn
    python examples/digits/train.py
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
N_HELDOUT = 360
N_CALIB = 200
OPSET = 13

SIDECAR = """\
# Data that goes with digits_cnn.onnx; `edgekit deploy/quantize` use it when no flag overrides.
[calibration]
data = "calib.npz"

[evaluation]
data = "heldout.npz"
labels = "heldout_labels.npy"
"""


def split_digits(seed: int = SEED) -> dict[str, np.ndarray]:
    """Digits as float32 [N,1,8,8] in [0,1]: train, calib (a subset of train), held-out."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    heldout, train = order[:N_HELDOUT], order[N_HELDOUT:]
    calib = rng.choice(train, size=N_CALIB, replace=False)
    return {
        "x_train": x[train], "y_train": y[train],
        "x_calib": x[calib],
        "x_heldout": x[heldout], "y_heldout": y[heldout],
    }


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        x = self.pool(x)
        x = torch.relu(self.conv3(x))
        return self.fc(torch.flatten(x, 1))


def shift(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random +-1 pixel translation: the digits are small, so this is most of the augmentation needed."""
    padded = nn.functional.pad(x, (1, 1, 1, 1))
    dy, dx = torch.randint(0, 3, (2,), generator=gen).tolist()
    return padded[:, :, dy:dy + 8, dx:dx + 8]


def train(data: dict[str, np.ndarray], epochs: int) -> DigitsCNN:
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = DigitsCNN()
    x, y = torch.from_numpy(data["x_train"]), torch.from_numpy(data["y_train"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    batches_per_epoch = (len(x) + 31) // 32
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=epochs * batches_per_epoch)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 32):
            idx = perm[i:i + 32]
            opt.zero_grad()
            loss = loss_fn(model(shift(x[idx], gen)), y[idx])
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


def to_onnx(model: DigitsCNN) -> onnx.ModelProto:
    """Write the graph by hand: Conv+BN+Relu x2, MaxPool, Conv+Relu, Flatten, Gemm."""
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, t: torch.Tensor) -> str:
        inits.append(numpy_helper.from_array(t.detach().numpy().astype(np.float32), name))
        return name

    def conv(name: str, src: str, m: nn.Conv2d) -> str:
        ins = [src, weight(f"{name}.weight", m.weight)]
        if m.bias is not None:
            ins.append(weight(f"{name}.bias", m.bias))
        nodes.append(helper.make_node("Conv", ins, [name], name=name, kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        return name

    def bn(name: str, src: str, m: nn.BatchNorm2d) -> str:
        ins = [src] + [
            weight(f"{name}.{p}", getattr(m, p)) for p in ("weight", "bias", "running_mean", "running_var")
        ]
        nodes.append(helper.make_node("BatchNormalization", ins, [name], name=name, epsilon=m.eps))
        return name

    def relu(name: str, src: str) -> str:
        nodes.append(helper.make_node("Relu", [src], [name], name=name))
        return name

    t = relu("relu1", bn("bn1", conv("conv1", "input", model.conv1), model.bn1))
    t = relu("relu2", bn("bn2", conv("conv2", t, model.conv2), model.bn2))
    nodes.append(helper.make_node("MaxPool", [t], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2]))
    t = relu("relu3", conv("conv3", "pool", model.conv3))
    nodes.append(helper.make_node("Flatten", [t], ["flatten"], name="flatten", axis=1))
    nodes.append(helper.make_node(
        "Gemm", ["flatten", weight("fc.weight", model.fc.weight), weight("fc.bias", model.fc.bias)],
        ["logits"], name="fc", transB=1,
    ))
    graph = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        initializer=inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edgekit-examples")
    m.ir_version = 8  # readable by every onnxruntime edgekit supports (>= 1.17)
    m.doc_string = "8x8 handwritten digit classifier (scikit-learn digits); input pixels/16, output logits."
    onnx.checker.check_model(m, full_check=True)
    return m


def verify(model: DigitsCNN, proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """ORT logits must equal torch's (atol 1e-4); returns ORT's logits, one sample at a time."""
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = np.concatenate([sess.run(None, {"input": x[i:i + 1]})[0] for i in range(len(x))])
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    err = float(np.abs(got - want).max())
    if err > 1e-4:
        raise SystemExit(f"ONNX Runtime disagrees with torch: max abs error {err:.2e}")
    print(f"ORT vs torch: max abs error {err:.2e}")
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE, help="output directory (default: next to this script)")
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)  # deterministic reductions; the model is tiny anyway

    data = split_digits()
    model = train(data, args.epochs)
    proto = to_onnx(model)
    logits = verify(model, proto, data["x_heldout"])
    acc = float((logits.argmax(1) == data["y_heldout"]).mean())
    print(f"fp32 held-out accuracy: {acc:.2%} ({int(round(acc * N_HELDOUT))}/{N_HELDOUT})")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, out / "digits_cnn.onnx")
    np.savez(out / "calib.npz", input=data["x_calib"])
    np.savez(out / "heldout.npz", input=data["x_heldout"])
    np.save(out / "heldout_labels.npy", data["y_heldout"])
    (out / "digits_cnn.edgekit.toml").write_text(SIDECAR)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
