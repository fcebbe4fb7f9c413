"""EfficientNet-Lite0 read from its registry wheel without torch (tests/imagenet.py): the network
written as ONNX names real photos as ImageNet does, and the .pth reader takes tensors only."""

from __future__ import annotations

import pickle

import imagenet
import numpy as np
import pytest
from PIL import Image
from realmodels import run_outputs

# ImageNet class indices: 985 daisy, 285 Egyptian cat, 967 espresso, 698 palace, 657 missile, 665 moped
EXPECTED = {"sklearn:flower.jpg": 985, "skimage:chelsea.png": 285, "skimage:coffee.png": 967, "sklearn:china.jpg": 698, "skimage:rocket.jpg": 657,
            "skimage:motorcycle_left.png": 665}  # fmt: skip


def _centre(spec: str) -> np.ndarray:
    im = imagenet._photo(spec)
    side = min(im.size)
    x0, y0 = (im.width - side) // 2, (im.height - side) // 2
    crop = im.crop((x0, y0, x0 + side, y0 + side)).resize((imagenet.SIZE, imagenet.SIZE), Image.BILINEAR)
    return ((np.asarray(crop, np.float32) - 127.0) / 128.0).transpose(2, 0, 1)[None]


@pytest.mark.realmodels
def test_converted_efficientnet_lite0_names_the_photos():
    from realmodels import real_model

    m = real_model("efficientnet-lite0")
    try:
        feeds = [{"input": _centre(spec)} for spec in EXPECTED]
    except (LookupError, FileNotFoundError) as exc:
        pytest.skip(f"photos unavailable: {exc}")
    got = [int(out[0].argmax()) for out in run_outputs(m.locate(), feeds, reference=False)]
    assert got == list(EXPECTED.values())


def test_photo_sets_share_no_photo_and_samples_are_deterministic():
    assert not set(imagenet.CALIB_PHOTOS) & set(imagenet.EVAL_PHOTOS)
    try:
        a, b = imagenet.photo_samples(imagenet.EVAL_PHOTOS, 3, 1), imagenet.photo_samples(imagenet.EVAL_PHOTOS, 3, 1)
    except (LookupError, FileNotFoundError) as exc:
        pytest.skip(f"photos unavailable: {exc}")
    assert a.shape == (3, 3, 224, 224) and np.array_equal(a, b) and np.abs(a).max() <= 1.0


def test_pth_reader_takes_tensors_only(tmp_path):
    """A .pth is a pickle: one that names anything but tensors and an OrderedDict is refused, unrun."""
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        for head in (0x1950A86A20F9469CFC6C, 1001, {}):
            pickle.dump(head, f, protocol=2)
        f.write(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(pickle.UnpicklingError, match="tensors only, not os.system"):
        imagenet.state_dict(path)
