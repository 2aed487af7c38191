"""Put this folder on PYTHONPATH to switch TIDE on, through TIDE_FSDP=in_place or
slot_reuse, in every Python process that starts (see tide/fsdp/_auto.py)."""

import os

if os.environ.get("TIDE_FSDP"):
    import tide.fsdp  # noqa: F401  (installs the switch)
