"""A local filesystem with injected write latency, as fsspec protocol `slow://` (tests and
`bench/train_ops.py stall`): each checkpoint data file opened for writing waits SLOW_WRITE_S
seconds first, as an upload to a distant store would."""

import os
import time

import fsspec
from fsspec.implementations.local import LocalFileSystem


class SlowFileSystem(LocalFileSystem):
    protocol = ("slow",)

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith("slow://"):
            path = path[len("slow://"):]
        return super()._strip_protocol(path)

    def _open(self, path, mode="rb", *args, **kwargs):
        if "w" in mode and path.endswith(".distcp"):
            time.sleep(float(os.environ.get("SLOW_WRITE_S", "1.0")))
        return super()._open(path, mode, *args, **kwargs)


def register() -> None:
    fsspec.register_implementation("slow", SlowFileSystem, clobber=True)
