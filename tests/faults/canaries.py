"""Canary credentials: values the fakes accept, set everywhere a real fleet would have its secrets, and
looked for everywhere they must not be (I4). Distinct and unlikely, so a hit is never a coincidence."""

from __future__ import annotations

CANARIES = {
    "RUNPOD_API_KEY": "rpcanary-5c1f0e9a7d3b42e8b6",
    "VAST_API_KEY": "vastcanary-9e2d4b7a1c6f38d0aa",
    "HF_TOKEN": "hf_canaryQx7Lm2Pz9Rw4Kv8Nb3Yt6Gd",
    "WANDB_API_KEY": "wandbcanary7f0c3e9b2d5a8146e0f3c7b9d2a5e8f1",
    # A seal key (32 url-safe base64 bytes: "sealcanary-3e9d1c7b5a2f4086e1d90"): never leaves the fleet.
    "FLEET_SEAL_KEY": "c2VhbGNhbmFyeS0zZTlkMWM3YjVhMmY0MDg2ZTFkOTA=",
}
