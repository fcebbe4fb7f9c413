"""The int8 gate: recommend int8 only when, on the device, it is faster than float beyond the
noise and its agreement with float holds. Pure functions of raw samples and an agreement dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgekit.bench.stats import stat

BOOTSTRAP = 1000
CONFIDENCE = 0.95
MIN_COSINE = 0.99  # without labels: every output this close to float
MIN_TOP1 = 0.99  # without labels: class vectors agree on this share of samples
MACHINE_NOTE = 0.05  # the device's own speed moved more than this between the benches: say so
# The device's own speed moved by m between two runs (compare.machine_shift, a fraction): a model's
# latency moves further than the loop with it. On the CI VM, with the loop 1.67-1.74x slower, the
# digits model ran 1.36-2.43x slower (log ratios up to 1.73 times the loop's), so a change counts only
# beyond machine_allowance(m) = (1 + m) ** 2 - 1 (2.79x for 1.67x, 10 % for 5 %). A change within it,
# when the machine moved more than MACHINE_UNSURE, is "inconclusive": too far to claim a change or none.
MACHINE_POWER = 2.0
MACHINE_UNSURE = 0.2


@dataclass(frozen=True)
class Verdict:
    recommended: str  # the variant to ship
    reasons: tuple[str, ...]
    speedup: float | None = None  # float p50 / int8 p50
    speedup_ci: tuple[float, float] | None = None  # its 95 % bootstrap interval
    checks: dict[str, bool] = field(default_factory=dict)
    candidates: dict[str, Verdict] = field(default_factory=dict)  # --choose measure: each int8 variant's own verdict
    machine: float = 0.0  # how far the device's own speed moved between the two benches (compare.machine_shift)
    rounds: tuple[float, ...] = ()  # --rounds: the speed-up in each round (fp32 and int8 timed one after the other)
    contention: str = ""  # other work on the device during a timed window that could explain the speed verdict

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "recommended": self.recommended,
            "reasons": list(self.reasons),
            "speedup_p50": self.speedup,
            "speedup_ci95": list(self.speedup_ci) if self.speedup_ci else None,
            "checks": dict(self.checks),
            "machine_shift": round(self.machine, 4),
            "speedup_rounds": list(self.rounds) or None,
            "contention": self.contention or None,
        }
        if self.candidates:
            doc["candidates"] = {name: v.to_dict() for name, v in self.candidates.items()}
        return doc


def machine_allowance(machine: float) -> float:
    """The change (a fraction) the device's own speed moving by ``machine`` can explain."""
    return (1.0 + machine) ** MACHINE_POWER - 1.0


def speedup_interval(
    baseline_ns: list[int], candidate_ns: list[int], seed: int = 0, q: float | None = 50.0
) -> tuple[float, float, float]:
    """Speed-up baseline/candidate at percentile ``q`` (default the median; None: the mean) and its
    bootstrap confidence interval (resampling both runs)."""
    a, b = np.asarray(baseline_ns, dtype=np.float64), np.asarray(candidate_ns, dtype=np.float64)
    rng = np.random.default_rng(seed)
    ratios = stat(rng.choice(a, (BOOTSTRAP, a.size)), q, 1) / stat(rng.choice(b, (BOOTSTRAP, b.size)), q, 1)
    tail = (1 - CONFIDENCE) / 2
    return float(stat(a, q) / stat(b, q)), float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))

def accuracy_holds(agreement: dict, max_drop: float) -> tuple[bool, str]:
    """Does int8 keep float's quality? Against labels: drop <= ``max_drop`` (a fraction);
    without: top-1 agreement on class vectors, else cosine, on every output."""
    drop = agreement.get("accuracy_drop")
    if drop is not None:
        ok = drop <= max_drop + 1e-12
        return ok, f"accuracy drop {drop * 100:.2f} points ({'within' if ok else 'beyond'} --max-drop {max_drop * 100:g})"
    worst = []
    for out in agreement.get("outputs") or []:
        if out.get("top1") is not None:
            worst.append((out["top1"] >= MIN_TOP1, f"{out['name']}: top-1 agreement {out['top1'] * 100:.1f}% (needs {MIN_TOP1 * 100:g}%)"))
        else:
            worst.append((out["cosine"] >= MIN_COSINE, f"{out['name']}: cosine {out['cosine']:.4f} (needs {MIN_COSINE})"))
    bad = [text for ok, text in worst if not ok]
    return not bad, "; ".join(bad) if bad else "outputs agree with float (" + "; ".join(t for _, t in worst) + ")"


def int8_verdict(
    float_name: str, float_ns: list[int], int8_ns: list[int], agreement: dict | None, max_drop: float, machine: float = 0.0,
    rounds: tuple[float, ...] = (), contended: tuple[str, str] = ("", ""),
) -> Verdict:
    """Recommend ``int8`` or ``float_name`` from the device's samples and the device's agreement.
    ``machine``: how far the device's own speed moved between the two benches (a fraction);
    ``rounds``: with --rounds, the speed-up of each round (its fp32 and int8 processes);
    ``contended``: other work seen in the float and the int8 run's timed windows
    (``record.contention_note`` of each, "" for none): where it could explain the speed verdict
    (float's slowed, when int8 looked faster; int8's, when it did not), the reasons say so."""
    speed, lo, hi = speedup_interval(float_ns, int8_ns)
    # the whole interval above 1, by more than the device's own speed moved, and in every round: faster beyond the noise
    faster = lo > 1.0 + machine_allowance(machine) and all(r > 1.0 for r in rounds)
    per_round = f"; per round {', '.join(f'{r:.2f}x' for r in rounds)}" if rounds else ""
    reasons = []
    if faster:
        reasons.append(f"int8 is {speed:.2f}x as fast as {float_name} at p50 (95% CI {lo:.2f}-{hi:.2f}x{per_round})")
    elif rounds and lo > 1.0 + machine_allowance(machine):
        reasons.append(f"int8 was not faster than {float_name} in every round ({speed:.2f}x at p50 overall{per_round})")
    elif machine > MACHINE_UNSURE:
        reasons.append(f"int8 looked {speed:.2f}x as fast as {float_name} at p50 (95% CI {lo:.2f}-{hi:.2f}x), on a device whose own speed changed between the benches")
    elif hi < 1.0:
        reasons.append(f"int8 is slower than {float_name} on this device ({speed:.2f}x at p50, 95% CI {lo:.2f}-{hi:.2f}x)")
    else:
        reasons.append(f"int8 is not faster than {float_name} beyond the noise ({speed:.2f}x at p50, 95% CI {lo:.2f}-{hi:.2f}x)")
    accurate, why = accuracy_holds(agreement, max_drop) if agreement else (False, "int8 agreement was not measured")
    if agreement and agreement.get("estimate"):
        why += f" (estimated on {agreement.get('measured_on')})"
    if machine > MACHINE_NOTE:
        reasons.insert(1, f"the device's own speed moved {machine * 100:.0f}% between the two benches (its reference loop): "
                          "the speed-up is uncertain by as much; rerun with --remeasure on a quiet device")
    note = contended[0] if faster else contended[1]  # the run whose slowing would explain the outcome
    contention = f"the device ran other work during {float_name if faster else 'int8'}'s timed window: {note}" if note else ""
    if contention:
        reasons.insert(1, f"{contention}: {'the speed-up may be overstated' if faster else 'int8 may be faster than measured'}; "
                          "rerun with --remeasure on a quiet device")
    reasons.append(why)
    recommended = "int8" if faster and accurate else float_name
    return Verdict(recommended, tuple(reasons), round(speed, 3), (round(lo, 3), round(hi, 3)), {"faster": faster, "accurate": accurate}, machine=machine,
                   rounds=tuple(round(r, 3) for r in rounds), contention=contention)  # fmt: skip


def choose_fastest(verdicts: dict[str, Verdict], backends: dict[str, str]) -> Verdict:
    """Of several int8 variants (``verdicts``, each against the same float run), the one to ship: the
    fastest at p50 whose own gate passes; the float variant when none passes. The reasons say why."""
    passing = {n: v for n, v in verdicts.items() if v.recommended == "int8"}
    lines = [f"{n} on {backends[n]}: {v.speedup:.2f}x fp32 at p50, {'passes' if n in passing else 'fails'} its gate" for n, v in verdicts.items()]
    if not passing:
        floats = {v.recommended for v in verdicts.values()}  # each failed gate names the float variant
        return Verdict(floats.pop() if len(floats) == 1 else "fp32", ("no int8 variant passes its gate", *lines), None, None, {}, dict(verdicts))
    name = max(passing, key=lambda n: passing[n].speedup or 0.0)
    best = passing[name]
    why = f"{name} on {backends[name]} is the fastest int8 variant that passes" + (f" (of {len(passing)})" if len(passing) > 1 else "")
    return Verdict(name, (why, *best.reasons, *lines), best.speedup, best.speedup_ci, dict(best.checks), dict(verdicts), best.machine, best.rounds)
