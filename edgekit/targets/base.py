"""The shape every backend has: what it supports, which scheme it wants, how it runs."""

from __future__ import annotations

from dataclasses import dataclass

from edgekit.modelio import LoadedModel
from edgekit.profiles import Profile
from edgekit.quantize.scheme import QuantScheme


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reasons: tuple[str, ...] = ()


class Backend:
    """A backend: subclasses set the class attributes and override ``supports``."""

    name: str = ""
    implemented: bool = True
    scheme: QuantScheme | None = None  # None: takes the model in float only
    archs: tuple[str, ...] = ("x86_64", "aarch64", "armv7l")
    agent_backend: str = ""  # the agent module that runs it on the device

    def supports(self, model: LoadedModel, profile: Profile) -> Verdict:
        if not self.implemented:
            return Verdict(False, (f"the {self.name} backend is not available in this edgekit version",))
        if profile.cpu.arch and profile.cpu.arch not in self.archs:
            return Verdict(False, (f"{self.name} does not run on {profile.cpu.arch}",))
        return Verdict(True)


class Unavailable(Backend):
    """A backend a profile may name that this edgekit version cannot use yet."""

    implemented = False

    def __init__(self, name: str) -> None:
        self.name = name
