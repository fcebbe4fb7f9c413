"""Write calibration and held-out data for the real PP-OCR models, ready for `edgekit quantize`.

For each model kind (cls, det, rec) this copies the model out of the installed
`rapidocr-onnxruntime` wheel into OUT_DIR and writes, beside it, `<kind>_calib.npz`,
`<kind>_heldout.npz` and the sidecar `<model stem>.edgekit.toml` that points at them (cls also
gets `cls_heldout_labels.npy`: 0 = upright, 1 = turned 180 degrees). Needs scikit-learn (the
photos) and the wheel: `pip install --no-deps rapidocr-onnxruntime scikit-learn`.

    python examples/real/make_data.py out/real
    edgekit quantize out/real/ch_ppocr_mobile_v2.0_cls_infer.onnx
    python examples/real/make_data.py out/real --kind det
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

# The data builders live with the tests that use them; one copy, so both see the same data.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import realmodels  # noqa: E402

DET_SIZE = (320, 320)
# kind -> (input shape for the sidecar, calibration count, held-out count, builder(n, seed))
KINDS: dict[str, tuple[tuple[int, ...], int, int, Callable[[int, int], np.ndarray]]] = {
    "cls": ((1, *realmodels.CLS_SHAPE), 200, 100, realmodels.cls_samples),
    "det": ((1, 3, *DET_SIZE), 32, 16, lambda n, seed: realmodels.det_samples(n, seed, DET_SIZE)),
    "rec": ((1, *realmodels.REC_SHAPE), 100, 50, realmodels.rec_samples),
}
CALIB_SEED, HELDOUT_SEED = 0, 1  # different seeds: held-out samples are not calibration samples
INPUT = "x"  # the PP-OCR models' input name


def _save_npz(path: Path, x: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        np.savez(f, **{INPUT: x})
    os.replace(tmp, path)


def write_kind(kind: str, out: Path) -> list[Path]:
    """Copy one model into out and write its data and sidecar; returns the files written."""
    shape, n_calib, n_heldout, build = KINDS[kind]
    model = realmodels.find_rapidocr_model(kind)
    dest = out / model.name
    shutil.copyfile(model, dest)
    written = [dest]

    _save_npz(out / f"{kind}_calib.npz", build(n_calib, CALIB_SEED))
    written.append(out / f"{kind}_calib.npz")
    labels_line = ""
    if kind == "cls":
        x, labels = realmodels.cls_dataset(n_heldout, HELDOUT_SEED)
        np.save(out / "cls_heldout_labels.npy", labels)
        written.append(out / "cls_heldout_labels.npy")
        labels_line = 'labels = "cls_heldout_labels.npy"\n'
    else:
        x = build(n_heldout, HELDOUT_SEED)
    _save_npz(out / f"{kind}_heldout.npz", x)
    written.append(out / f"{kind}_heldout.npz")

    sidecar = out / f"{dest.stem}.edgekit.toml"
    sidecar.write_text(
        f"# Data that goes with {dest.name} (PP-OCR, Apache-2.0), made by examples/real/make_data.py.\n"
        f'[calibration]\ndata = "{kind}_calib.npz"\n\n'
        f'[evaluation]\ndata = "{kind}_heldout.npz"\n{labels_line}\n'
        f"[inputs.{INPUT}]\nshape = {list(shape)}\n"
    )
    written.append(sidecar)
    return written


def _fail(message: str, hint: str) -> int:
    print(f"error: {message}\nhint: {hint}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="directory to write into (created if missing)")
    parser.add_argument(
        "--kind", action="append", choices=sorted(KINDS),
        help="model to prepare; repeat for several (default: all three)",
    )
    args = parser.parse_args(argv)
    try:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        for kind in args.kind or sorted(KINDS):
            for path in write_kind(kind, args.out_dir):
                print(path)
    except LookupError as exc:
        return _fail(str(exc), f"pip install --no-deps {realmodels.RAPIDOCR_DIST}")
    except ModuleNotFoundError as exc:
        return _fail(f"{exc.name} is not installed (the sample photos come from scikit-learn)", "pip install scikit-learn")
    except OSError as exc:
        return _fail(f"cannot write to {args.out_dir}: {exc.strerror or exc}", "pass a writable directory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
