"""EfficientNet-Lite0 and -Lite1 read from their registry wheels without torch (tests/imagenet.py):
the networks written as ONNX name real photos as ImageNet does, and the .pth reader takes tensors
only."""

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


# Lite1 calls the rocket's launch tower 540 (drilling platform), at 0.10: the other five as Lite0.
EXPECTED_LITE1 = {k: v for k, v in EXPECTED.items() if k != "skimage:rocket.jpg"}
# Lite2 also calls the daisy close-up 599 (honeycomb), at 0.39 (at 224 px Lite0 is surer of these
# photos than at 240 too: their objects fill the frame): the other four as Lite0.
EXPECTED_LITE2 = {k: v for k, v in EXPECTED_LITE1.items() if k != "sklearn:flower.jpg"}


def _centre(spec: str, size: int = imagenet.SIZE) -> np.ndarray:
    im = imagenet._photo(spec)
    side = min(im.size)
    x0, y0 = (im.width - side) // 2, (im.height - side) // 2
    crop = im.crop((x0, y0, x0 + side, y0 + side)).resize((size, size), Image.BILINEAR)
    return ((np.asarray(crop, np.float32) - 127.0) / 128.0).transpose(2, 0, 1)[None]


@pytest.mark.realmodels
@pytest.mark.parametrize(("name", "expected"), [
    ("efficientnet-lite0", EXPECTED), ("efficientnet-lite1", EXPECTED_LITE1), ("efficientnet-lite2", EXPECTED_LITE2),
])
def test_converted_efficientnet_lite_names_the_photos(name, expected):
    from realmodels import real_model

    m = real_model(name)
    try:
        feeds = [{"input": _centre(spec, m.inputs["input"][-1])} for spec in expected]
    except (LookupError, FileNotFoundError) as exc:
        pytest.skip(f"photos unavailable: {exc}")
    got = [int(out[0].argmax()) for out in run_outputs(m.locate(), feeds, reference=False)]
    assert got == list(expected.values())


def test_the_block_table_is_read_from_the_weights():
    """Lite0's 16 blocks and Lite1's 21 (ceil(1.1 x) repeats, the first and last stage's kept), from
    the shapes alone: a stage starts where the output width changes and strides as STAGES says."""

    def fake(repeats):
        sd, i = {}, 0
        for (_, k, _, expand, cin, cout), r in zip(imagenet.STAGES, repeats):
            for j in range(r):
                c = cin if j == 0 else cout
                if expand != 1:
                    sd[f"_blocks.{i}._expand_conv.weight"] = np.zeros((c * expand, c, 1, 1))
                sd[f"_blocks.{i}._depthwise_conv.weight"] = np.zeros((c * expand, 1, k, k))
                sd[f"_blocks.{i}._project_conv.weight"] = np.zeros((cout, c * expand, 1, 1))
                i += 1
        return sd

    lite0 = imagenet.blocks(fake([1, 2, 2, 3, 3, 4, 1]))
    assert len(lite0) == 16 and [b[1] for b in lite0] == [1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1]
    assert [b[3] for b in lite0] == [False, False, True, False, True, False, True, True, False, True, True, False, True, True, True, False]
    assert [b[0] for b in lite0][:4] == [3, 3, 3, 5] and not lite0[0][2] and all(b[2] for b in lite0[1:])
    assert len(imagenet.blocks(fake([1, 3, 3, 4, 4, 5, 1]))) == 21
    with pytest.raises(ValueError, match="6 stages, not 7"):
        imagenet.blocks(fake([1, 2, 2, 3, 3, 4, 0]))


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
