"""The HTML report: its DOM (charts per section, escaping, nothing external), `edgekit report` on a
real local deploy of the digits example, and the file as headless Chromium renders it, online and
with the network disabled."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLES, REPO, assert_one_line_error

from edgekit.bench.record import make_record
from edgekit.errors import EXIT_INPUT, OutputPathError
from edgekit.report import render_report, write_report
from tests.builders import bench_doc

DIGITS = EXAMPLES / "digits"
SCREENSHOT = REPO / "docs" / "images" / "report.png"


# -- a DOM to look into -----------------------------------------------------------------------
class Dom(HTMLParser):
    """Every start tag with its attributes, the text, and the style sheets' text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.styles: list[str] = []
        self._in_style = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, {k: v or "" for k, v in attrs}))
        self._in_style = tag == "style"

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        (self.styles if self._in_style else self.text).append(data)

    def ids(self, tag: str | None = None) -> list[str]:
        return [a["id"] for t, a in self.elements if "id" in a and (tag is None or t == tag)]

    def count(self, tag: str, cls: str) -> int:
        return sum(1 for t, a in self.elements if t == tag and cls in a.get("class", "").split())

    def all_text(self) -> str:
        return "".join(self.text)


def chart_ids(dom: Dom) -> set[str]:
    return {a["id"] for t, a in dom.elements if t == "svg" and "chart" in a.get("class", "").split()}


# -- records built here: every optional field of the contract, and none ------------------------
def _rich_records() -> tuple[list[dict], list[dict]]:
    """An fp32 and an int8 run with warm-up, device state (throttled), energy, layers joined with the
    quantizer's per-layer error, agreement and a recommendation; plus 5 older runs of each."""
    rng = np.random.default_rng(7)

    def samples(ms: float, n: int = 200) -> list[int]:
        return [int(v) for v in rng.lognormal(np.log(ms * 1e6), 0.05, n)]

    state = {
        "before": {"governor": "ondemand", "temp_c": 48.5, "freq_mhz": {"cpu0": 2400.0}, "freq_max_mhz": {"cpu0": 2400.0},
                   "thermal": {"cpu-thermal": 48.5}, "throttled": {"source": "vcgencmd", "now": False, "ever": False, "detail": "0x0"}},
        "after": {"governor": "ondemand", "temp_c": 81.2, "freq_mhz": {"cpu0": 1500.0}, "freq_max_mhz": {"cpu0": 2400.0},
                  "thermal": {"cpu-thermal": 81.2}, "throttled": {"source": "vcgencmd", "now": True, "ever": True, "detail": "0x80008"}},
    }  # fmt: skip
    layers = [{"name": f"conv{i}", "op": "Conv", "ns": ns, "calls": 1} for i, ns in enumerate([900_000, 400_000, 200_000])]
    layers.append({"name": "head", "op": "Gemm", "ns": 50_000, "calls": 1})
    quant = {"layers": [{"name": "conv0", "op": "Conv", "snr_db": 40.0}, {"name": "conv1", "op": "Conv", "snr_db": 30.0},
                        {"name": "head", "op": "Gemm", "snr_db": 35.0}]}  # fmt: skip
    agreement = {"samples": 360, "source": "heldout.npz", "outputs": [{"name": "logits", "cosine": 0.9999, "snr_db": 37.7,
                 "max_abs_err": 0.5, "top1": 0.997}], "accuracy_fp32": 0.99, "accuracy_int8": 0.985,
                 "measured_on": "rpi5: fp32 on onnxruntime, int8 on onnxruntime", "estimate": False, "accuracy_drop": 0.005}  # fmt: skip
    verdict = {"recommended": "int8", "reasons": ["int8 is 1.90x as fast as fp32 at p50 (95% CI 1.88-1.93x)", "accuracy drop 0.50 points"],
               "speedup_p50": 1.9, "speedup_ci95": [1.88, 1.93], "checks": {"faster": True, "accurate": True}}  # fmt: skip

    def run(variant: str, ms: float, day: int, **extra) -> dict:
        doc = bench_doc(samples(ms), variant=variant, precision=variant, warmup_samples_ns=samples(ms * 3, 20),
                        device_state=state, energy={"source": "rapl", "joules": 1.0, "mj_per_inference": ms * 2},
                        layers=layers if variant == "int8" else None)  # fmt: skip
        doc["config"]["warmup_mode"] = "auto"
        rec = make_record(doc, model_name="resnet18", target="rpi5", device="pi@10.0.0.7",
                          extra={"vcs": {"branch": "main", "commit": f"{day:040x}"}, **extra})  # fmt: skip
        rec["created"] = f"2025-03-{day:02d}T10:00:00.000000+00:00"
        return rec

    current = [run("fp32", 3.8, 20), run("int8", 2.0, 20, agreement=agreement, recommendation=verdict, quantization=quant)]
    older = [run(v, ms * (1 + d / 50), d) for d in range(10, 15) for v, ms in (("fp32", 3.8), ("int8", 2.0))]
    return current, older


GATES = [
    {"gate": {"metric": "p50", "text": "p50:+5%"}, "passed": True, "line": "p50 2.00 ms vs 2.10 ms (-4.8%, limit +5%): pass"},
    {"gate": "p99:<2ms", "passed": False, "line": "p99 2.3 ms, limit < 2 ms: FAIL", "variant": "int8"},
    {"gate": "energy:+10%", "passed": None, "line": "energy: no baseline yet"},
]


def test_every_section_draws_its_charts():
    records, older = _rich_records()
    dom = Dom(render_report(records, history=older, gates=GATES))
    assert {"summary", "comparison", "distribution", "timeline", "layers", "history", "device"} <= set(dom.ids("section"))
    assert chart_ids(dom) == {
        "chart-compare", "chart-latency-fp32", "chart-latency-int8", "chart-timeline-fp32", "chart-timeline-int8",
        "chart-layers-int8", "chart-history",
    }  # fmt: skip
    text = dom.all_text()
    assert "Recommended:" in text and "int8 is 1.90x as fast as fp32" in text
    assert [dom.count("li", c) for c in ("pass", "fail", "none")] == [1, 1, 1]
    assert "2 of 3 gates pass" not in text and "1 of 3 gates pass" in text  # the unknown one does not pass
    assert dom.count("rect", "bin") > 10  # two histograms of 200 samples
    assert dom.count("line", "whisker") == 2  # p99 beyond p50 for both variants
    assert dom.count("rect", "warmup") == 2 and "warm-up (20)" in text and "20 warm-up (auto)" in text
    assert dom.count("rect", "throttled") == 2 and "THROTTLED (vcgencmd: 0x80008)" in text
    assert "48.5 °C at start" in text and "81.2 °C at end" in text
    assert dom.count("rect", "layer-bar") == 4 and dom.count("rect", "error-bar") == 3  # conv2 has no SNR
    assert "conv0 costs 58% of the time and adds 7% of the int8 error (SNR 40.0 dB at its output). 1550 µs per inference" in text
    assert dom.count("circle", "run") == 12  # 5 older + this run, per variant
    assert "Accuracy on 360 labelled held-out samples: float 99.00%, int8 98.50% (drop +0.50 points)." in text
    speedups = {float(x) for x in re.findall(r"(\d\.\d\d)× fp32", text)}  # tile and bar note: one value
    assert len(speedups) == 1 and abs(speedups.pop() - 1.9) < 0.05
    ids = dom.ids()
    assert len(ids) == len(set(ids)), "element ids must be unique"


def test_old_records_without_the_optional_fields_still_report():
    rec = make_record(bench_doc([1_000_000, 1_100_000, 1_200_000]), model_name="m", target="t", device="d")
    for key in ("device_state", "layers"):
        rec["agent"].pop(key, None)
    dom = Dom(render_report([rec]))
    assert chart_ids(dom) == {"chart-compare", "chart-latency-int8", "chart-timeline-int8"}
    text = dom.all_text()
    assert "warm-up samples not recorded" in text
    assert "No backend reported a per-layer profile" in text and "the history starts here" in text


def test_layers_whose_time_varies_widely_between_profiled_runs_are_marked():
    layers = [{"name": "steady", "op": "Conv", "ns": 900_000, "ns_p25": 880_000, "ns_p75": 930_000, "calls": 20},
              {"name": "jumpy", "op": "Conv", "ns": 400_000, "ns_p25": 200_000, "ns_p75": 900_000, "calls": 20},
              {"name": "old", "op": "Relu", "ns": 100_000, "calls": 20}]  # fmt: skip  # no spread reported: not marked
    rec = make_record(bench_doc([2_000_000, 2_100_000], layers=layers), model_name="m", target="t", device="d")
    text = Dom(render_report([rec])).all_text()
    assert "jumpy ⚠ spread 175%" in text and "steady ⚠" not in text and "old ⚠" not in text
    assert "Marked ⚠: 1 layer(s) whose time varied widely" in text and "each its median over the profiled runs" in text


def test_strings_from_records_are_escaped():
    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    rec = make_record(bench_doc([2_000_000, 2_100_000], variant=evil, backend=evil,
                                layers=[{"name": evil, "op": evil, "ns": 10}],
                                device={"hostname": evil, evil: evil}),
                      model_name=evil, target=evil, device=evil, extra={"vcs": {"branch": evil, "commit": evil},
                      "recommendation": {"recommended": evil, "reasons": [evil]}})  # fmt: skip
    gates = [{"gate": evil, "passed": False, "line": evil, "variant": evil}]
    dom = Dom(render_report([rec], title=evil, gates=gates))
    tags = {t for t, _ in dom.elements}
    assert "script" not in tags and "img" not in tags
    assert not any(k.startswith("on") for _, a in dom.elements for k in a)
    assert dom.all_text().count(evil) >= 10  # shown as text, verbatim, everywhere it appears


def test_nothing_is_fetched():
    records, older = _rich_records()
    text = render_report(records, history=older, gates=GATES)
    dom = Dom(text)
    tags = {t for t, _ in dom.elements}
    assert not tags & {"script", "link", "img", "iframe", "object", "embed", "base"}
    for tag, attrs in dom.elements:
        for key in ("src", "href", "xlink:href", "srcset", "action", "poster", "data"):
            if key in attrs:
                assert attrs[key].startswith("#"), (tag, key, attrs[key])
    assert "url(" not in "".join(dom.styles) and "@import" not in "".join(dom.styles) and "@font-face" not in "".join(dom.styles)
    assert " style=" not in text.replace('style="--c:#', "")  # inline styles only set a palette colour


def test_write_is_atomic_and_deterministic(tmp_path):
    records, older = _rich_records()
    out = write_report(records, tmp_path / "r.html", history=older, gates=GATES)
    again = write_report(records, tmp_path / "r2.html", history=older, gates=GATES)
    assert out == tmp_path / "r.html" and out.read_bytes() == again.read_bytes()
    with pytest.raises(OutputPathError):
        write_report(records, tmp_path / "missing" / "r.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r2.html"]


def test_several_models_get_their_own_sections():
    a = make_record(bench_doc([1_000_000] * 3), model_name="a", target="t", device="d")
    b = make_record(bench_doc([9_000_000] * 3), model_name="b", target="t", device="d")
    dom = Dom(render_report([a, b]))
    assert {"chart-latency-int8", "chart-latency-int8-2", "chart-compare-2"} <= chart_ids(dom)
    assert {"group-1", "group-2", "layers", "layers-2"} <= set(dom.ids())


# -- `edgekit report` on a real deploy ------------------------------------------------------------
@pytest.fixture(scope="module")
def deployed(tmp_path_factory) -> dict:
    """Two real local deploys of the digits example in a store of their own: the first is history."""
    home = tmp_path_factory.mktemp("report-home")
    env = {**os.environ, "CI": "1", **{v: str(home / v.lower()) for v in ("EDGEKIT_DATA_DIR", "EDGEKIT_CONFIG_DIR", "EDGEKIT_CACHE_DIR")}}
    env.pop("EDGEKIT_DEBUG", None)
    args = [sys.executable, "-m", "edgekit", "deploy", DIGITS / "digits_cnn.onnx", "--target", "local", "--calib", DIGITS / "calib.npz",
            "--eval", DIGITS / "heldout.npz", "--labels", DIGITS / "heldout_labels.npy", "--json", "--remeasure"]  # fmt: skip
    docs = []
    for _ in range(2):
        proc = subprocess.run(list(map(str, args)), cwd=home, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        docs.append(json.loads(proc.stdout))
    ids = [str(r["id"]) for r in docs[1]["runs"]]
    return {"home": home, "env": {"EDGEKIT_DATA_DIR": env["EDGEKIT_DATA_DIR"]}, "ids": ids}


@pytest.fixture(scope="module")
def real_report(deployed) -> Path:
    out = deployed["home"] / "report.html"
    proc = subprocess.run([sys.executable, "-m", "edgekit", "report", *deployed["ids"], "-o", str(out), "--json"],
                          env={**os.environ, **deployed["env"]}, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["report"] == str(out) and doc["history_runs"] == 2 and doc["bytes"] == out.stat().st_size
    assert [r["variant"] for r in doc["runs"]] == ["fp32", "int8"]
    return out


def test_report_of_a_real_deploy(real_report, deployed):
    dom = Dom(real_report.read_text(encoding="utf-8"))
    assert {"chart-compare", "chart-latency-fp32", "chart-latency-int8", "chart-timeline-fp32", "chart-timeline-int8",
            "chart-history"} <= chart_ids(dom)  # fmt: skip
    assert "chart-layers-int8" in chart_ids(dom)  # ekrt's per-op timers
    shown = [json.loads(subprocess.run([sys.executable, "-m", "edgekit", "results", "show", i, "--json"], env={**os.environ, **deployed["env"]},
                                       capture_output=True, text=True, timeout=60).stdout) for i in deployed["ids"]]  # fmt: skip
    layers = next(r for r in shown if r["agent"]["variant"] == "int8")["agent"]["layers"]
    assert layers and all(x["ns_p25"] <= x["ns"] <= x["ns_p75"] for x in layers), layers[:3]  # medians over the profiled runs
    text = dom.all_text()
    assert "Recommended:" in text and "labelled held-out samples" in text
    assert dom.count("circle", "run") == 4  # the first deploy is the history of the second


def test_report_from_an_export_file_and_without_history(cli, deployed, tmp_path):
    export = tmp_path / "runs.json"
    assert cli("results", "export", *deployed["ids"], "-o", export, env=deployed["env"]).returncode == 0
    r = cli("report", export, "--history", "0", "-o", "r.html", env=deployed["env"])
    assert r.returncode == 0, r.stderr
    ids = chart_ids(Dom((tmp_path / "r.html").read_text(encoding="utf-8")))
    assert "chart-latency-int8" in ids and "chart-history" not in ids


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["999"], "no result with id 999"),
        (["missing.json"], "no such file: missing.json"),
        (["bad.json"], "bad.json is not JSON"),
        (["other.json"], "not an edgekit results export"),
        (["1", "-o", "nodir/r.html"], "output directory does not exist"),
    ],
)
def test_bad_inputs_say_why_and_write_nothing(cli, deployed, tmp_path, args, needle):
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "other.json").write_text('{"kind": "something else"}', encoding="utf-8")
    before = sorted(p.name for p in tmp_path.iterdir())
    r = cli("report", *args, env=deployed["env"])
    assert_one_line_error(r, EXIT_INPUT, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no report, no temp file


# -- headless Chromium ------------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium")


def _chromium(page: Path, *flags: str, offline: bool = False) -> subprocess.CompletedProcess:
    argv = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={page.parent / 'chromium-profile'}", *flags, page.as_uri()]  # fmt: skip
    if offline:
        if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
            argv = ["unshare", "-n", *argv]  # no network interface at all, not even a resolver
        else:  # unprivileged: every request goes to a closed local port, loopback included
            argv[1:1] = ["--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _pixels(png: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(png) as im:
        return np.asarray(im.convert("RGB"))


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/system-deps.sh installs Debian's chromium as root)")
def test_chromium_renders_the_report_online_and_offline(real_report, tmp_path):
    page = tmp_path / real_report.name
    shutil.copy(real_report, page)
    shots = {}
    for offline in (False, True):
        shot = tmp_path / f"report-{'offline' if offline else 'online'}.png"
        _chromium(page, f"--screenshot={shot}", "--window-size=1280,2000", offline=offline)
        dom = Dom(_chromium(page, "--dump-dom", offline=offline).stdout)
        assert {"chart-compare", "chart-latency-fp32", "chart-latency-int8", "chart-timeline-int8", "chart-layers-int8",
                "chart-history"} <= chart_ids(dom), offline  # fmt: skip
        shots[offline] = _pixels(shot)
    print(f"\nscreenshot of the report: {tmp_path / 'report-online.png'}")
    img = shots[False]
    assert img.shape == (2000, 1280, 3)
    colours = np.unique(img.reshape(-1, 3), axis=0)
    assert len(colours) > 200, "the page looks blank"
    ink = img.min(axis=2) < 200
    assert ink.mean() > 0.01 and ink.any(axis=1).mean() > 0.4, "hardly anything is drawn"
    for rgb in ((0x3B, 0x6F, 0xD4), (0xE8, 0x77, 0x2E)):  # the fp32 and int8 colours below the summary tiles:
        near = np.abs(img[700:].astype(int) - rgb).sum(axis=2) < 30  # the SVG bars, histograms and lines were drawn
        assert near.sum() > 1000, (rgb, near.sum())
    assert (shots[True] == img).mean() > 0.999, "the page renders differently without a network"
    if os.environ.get("EDGEKIT_UPDATE_SCREENSHOT") == "1":
        _save_docs_screenshot(tmp_path / "report-online.png")


def _save_docs_screenshot(png: Path) -> None:
    """The README's picture: the top of the page, reduced to a palette so it stays small."""
    from PIL import Image

    with Image.open(png) as im:
        small = im.convert("RGB").crop((0, 0, 1280, 1900)).quantize(colors=96, dither=Image.Dither.NONE)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    small.save(SCREENSHOT, optimize=True)
    assert SCREENSHOT.stat().st_size < 300_000
