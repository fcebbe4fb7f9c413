"""Typed errors. Each carries a one-line message and a hint: the next thing to try.

The CLI maps them to ``error: ...`` / ``hint: ...`` on stderr and an exit code. Exit codes
are part of the interface (CI scripts branch on them), so they live here, once.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug: an exception that is not an EdgekitError
EXIT_USAGE = 2  # bad flags or arguments (also typer/click's own usage errors)
EXIT_INPUT = 3  # the model, calibration data, profile or an output path is unusable
EXIT_DEVICE = 4  # the device or the transport to it failed
EXIT_GATE = 5  # a regression gate failed: the run worked, the numbers did not


class EdgekitError(Exception):
    """Base class: ``message`` says what is wrong, ``hint`` what to do about it."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(EdgekitError):
    exit_code = EXIT_USAGE


class InputError(EdgekitError):
    """Something the user gave us is unusable (base for model/data/profile errors)."""

    exit_code = EXIT_INPUT


class ModelError(InputError):
    pass


class CalibrationError(InputError):
    pass


class ProfileError(InputError):
    pass


class OutputPathError(InputError):
    pass


class PlanError(InputError):
    """No backend of the profile can run the model."""


class DeviceError(EdgekitError):
    exit_code = EXIT_DEVICE


class TransportError(DeviceError):
    pass


class LinkError(TransportError):
    """The network link to the device failed (dropped, stalled, refused, unreachable).

    Unlike other transport errors, trying again may work: pushes retry these with back-off.
    """


class LockLostError(DeviceError):
    """Our device lock was broken or removed while we worked: what we measured may be disturbed."""


class AgentError(DeviceError):
    """The device-side agent ran but failed or printed something we cannot read."""

    def __init__(self, message: str, hint: str = "", reason: str = "") -> None:
        super().__init__(message, hint)
        self.reason = reason  # the agent's word for what failed: "compile" (the runtime refused the model), or ""


class ResultsError(InputError):
    pass


class GateError(EdgekitError):
    exit_code = EXIT_GATE
