"""The cuda backend (``backend``): float partitions as torch programs captured as CUDA graphs.

Registered on import where ``device.chosen()`` names a device: a GPU the NVIDIA driver shows, or
the device ``$NNHAL_CUDA_DEVICE`` names (``cpu``: torch's CPU device, opt-in, for tests). Where
there is none, torch is not imported and nothing is registered; where torch is not installed
(``pip install nnhal[cuda]``) the import fails and the registry goes on without the backend.
"""
from hal.backends.cuda.device import chosen

DEVICE = chosen()
if DEVICE is not None:
    from hal.backends.cuda.backend import register

    BACKEND = register(DEVICE)
