"""Which torch device the cuda backend runs on, decided without importing torch where there is
no GPU (torch costs a second and a half of start-up in every process that loads the backends).

``NNHAL_CUDA_DEVICE``: ``cuda`` / ``cuda:N`` (that GPU), ``cpu`` (torch's CPU device: the lowering
and the backend tested on a machine without a GPU; opt-in, never in the default preference
order), ``off`` (no cuda backend). Unset: ``cuda`` where the NVIDIA driver shows a GPU, else none.
"""
from __future__ import annotations

import os

ENV_VAR = "NNHAL_CUDA_DEVICE"


def gpu_present() -> bool:
    """Whether the NVIDIA kernel driver lists a GPU (what nvidia-smi reads), without CUDA."""
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return os.path.exists("/dev/nvidiactl") and os.path.exists("/dev/nvidia0")


def chosen() -> str | None:
    """The device the backend registers on at start (None: no cuda backend)."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value == "off":
        return None
    if value:
        return value
    return "cuda" if gpu_present() else None


def driver_version() -> str:
    """The NVIDIA kernel driver's version ('' when unknown): part of a cache entry's identity."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split()
    except OSError:
        return ""
    return next((w for w in words if w[:1].isdigit() and "." in w), "")
