"""Loading a voyage file: a Python file exposing `voyage(config) -> steps`.

Nothing is built at import time (Marin #6614: import-time steps froze state); the function is
called once with the parsed config. Errors in the file (missing, syntax, an exception while
importing or building) become one `VoyageError` naming the file and line.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import sys
import traceback
import types
import typing
from typing import Any, Callable

from executor.errors import VoyageError
from executor.step import Step

ENTRY = "voyage"


@dataclasses.dataclass
class VoyageFile:
    path: str
    name: str
    module: types.ModuleType
    fn: Callable[..., Any]
    config_class: type | None


def name_of(path: str) -> str:
    """A voyage's name: its file's, without `.py` (what `load` names it, without importing it)."""
    return os.path.splitext(os.path.basename(path))[0]


def load(path: str) -> VoyageFile:
    """Import a voyage file and find its entry function and config dataclass."""
    if not os.path.isfile(path):
        raise VoyageError(f"voyage file {path!r} not found")
    name = name_of(path)
    module_name = f"marin_voyage_{name}".replace("-", "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise VoyageError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise VoyageError(f"{e.filename or path}:{e.lineno}: {e.msg}") from None
    except VoyageError:
        raise
    except SystemExit as e:  # `sys.exit()` while importing: not marin-run's own exit, and never a 0
        raise VoyageError(f"{_where(e, path)}: the voyage file called sys.exit({e.code!r}) while it was "
                          "imported; a voyage file only defines `voyage(config)`") from None
    except RecursionError:
        raise VoyageError(f"{path}: RecursionError while importing (a cyclic or too deeply nested value?)") from None
    except Exception as e:
        raise VoyageError(f"{_where(e, path)}: {type(e).__name__}: {e}") from None
    fn = getattr(module, ENTRY, None)
    if not callable(fn):
        raise VoyageError(f"{path}: defines no function `{ENTRY}(config)` returning its steps")
    params = list(inspect.signature(fn).parameters.values())
    config_class = None
    if params:
        hints = typing.get_type_hints(fn)
        config_class = hints.get(params[0].name)
        if config_class is None or not dataclasses.is_dataclass(config_class):
            raise VoyageError(f"{path}: `{ENTRY}`'s first parameter must be annotated with a config dataclass")
    return VoyageFile(path=path, name=name, module=module, fn=fn, config_class=config_class)


def build_steps(vf: VoyageFile, config: Any) -> list[Step]:
    """Call the voyage function and check that it returned Steps."""
    try:
        result = vf.fn(config) if vf.config_class is not None else vf.fn()
    except VoyageError:
        raise
    except SystemExit as e:
        raise VoyageError(f"{_where(e, vf.path)}: `{ENTRY}` called sys.exit({e.code!r}); it must return its "
                          "steps") from None
    except Exception as e:
        raise VoyageError(f"{_where(e, vf.path)}: {type(e).__name__}: {e}") from None
    if isinstance(result, Step):
        result = [result]
    elif isinstance(result, dict):
        result = list(result.values())
    steps = list(result or [])
    for s in steps:
        if not isinstance(s, Step):
            raise VoyageError(f"{vf.path}: `{ENTRY}` must return Steps, got {type(s).__name__}")
    return steps


def call_hook(vf: VoyageFile, name: str, config: Any, missing: Any = None) -> Any:
    """The voyage's optional function `name(config)` (`license_policy`, `pins`, `costs`), called as
    the voyage function is (with the config when the voyage has one); `missing` when the file
    defines none. What it raises, other than a VoyageError, is one VoyageError naming the hook."""
    fn = getattr(vf.module, name, None)
    if not callable(fn):
        return missing
    try:
        return fn(config) if vf.config_class is not None else fn()
    except VoyageError:
        raise
    except Exception as e:
        raise VoyageError(f"{vf.path}: {name}() failed: {type(e).__name__}: {e}") from None


def _where(e: BaseException, path: str) -> str:
    """file:line of the deepest frame of the voyage file (or of any project file) in a traceback."""
    frames = traceback.extract_tb(e.__traceback__)
    target = os.path.abspath(path)
    for frame in reversed(frames):
        if os.path.abspath(frame.filename) == target:
            return f"{path}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else path
