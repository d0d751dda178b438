"""Suite-wide settings. Triton must run in interpreter mode on CPU-only machines, and the flag
has to be set before any kernel is defined, so it is set here, before test modules import."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
