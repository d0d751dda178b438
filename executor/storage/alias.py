"""A stable, human-readable way to a step's committed output: `{prefix}/{step name}`.

Outputs live in the committed attempt's folder (`{name}-{digest10}/.attempts/{id}/`, named only
by `.status`; executor.attempts). For a step type declared with `alias=True` (the Hugging Face
export), the worker points `{prefix}/{step name}` at the attempt it has just committed:

- on a local disk, a relative symlink (`out/export/laptop -> laptop-2a4c9c4c95/.attempts/0001-…`),
  so `from_pretrained("out/export/laptop/hf")` loads the newest committed export, and a moved or
  copied prefix (or one served by `python -m http.server`) still resolves it;
- on an object store, which has no links, a small pointer object `{prefix}/{step name}/SERVED`
  holding the attempt folder's URL (`marin-run VOYAGE --path STEP` prints the same).

The executor never reads an alias back: plans, runs, `--gc` and `--path` go through `.status`.
Writing one never fails the step (a warning). An alias is the newest commit of any config of that
step name: two configs of one step on one prefix share it.
"""

from __future__ import annotations

import logging
import os
import posixpath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executor.storage.store import Store

log = logging.getLogger("marin.alias")
POINTER = "SERVED"


def alias_path(name: str) -> str:
    """The alias of step `name`, relative to the prefix."""
    return name


def write_alias(store: Store, name: str, dirname: str, attempt_dir: str) -> None:
    """Point `{prefix}/{name}` at `{dirname}/{attempt_dir}`; a warning if it cannot."""
    try:
        if store.is_local:
            _symlink(store, name, dirname, attempt_dir)
        else:
            from executor.storage.files import write_atomic

            url = store.url(f"{dirname}/{attempt_dir}")
            write_atomic(store.path(alias_path(name), POINTER), (url + "\n").encode(), fs=store.fs)
    except Exception as e:  # noqa: BLE001 - an alias is a convenience; the output is committed
        log.warning("%s: alias %s not written (%s: %s); the output is committed", name,
                    store.url(alias_path(name)), type(e).__name__, e)


def _symlink(store: Store, name: str, dirname: str, attempt_dir: str) -> None:
    link = store.path(alias_path(name))
    if os.path.lexists(link) and not os.path.islink(link):
        raise FileExistsError(f"{link} exists and is not an alias (a symlink); left as it is")
    target = posixpath.relpath(store.path(dirname, attempt_dir), posixpath.dirname(link))
    os.makedirs(posixpath.dirname(link), exist_ok=True)
    from executor.storage.files import temp_path

    tmp = temp_path(link)  # a leftover (a crash right here) is a temporary --gc removes
    os.symlink(target, tmp)
    os.replace(tmp, link)  # readers see the old alias or the new one
