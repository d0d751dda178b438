"""A voyage's config from its command-line overrides (`marin-run VOYAGE.py --field value ...`),
parsed by draccus into the voyage's config dataclass: one line (VoyageError) for a bad value, an
unknown field or an unreadable `--config_path`. Used by `marin-run` and by `--diff`'s plan of
another revision."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

from executor.errors import VoyageError

if TYPE_CHECKING:
    from executor.voyage import VoyageFile

PROG = "marin-run"


def parse_config(vf: VoyageFile, overrides: list[str]) -> object:
    config_class = vf.config_class
    if config_class is None:
        if overrides:
            raise VoyageError(f"unrecognized arguments: {' '.join(overrides)} (the voyage takes no config; "
                              f"see {PROG} {vf.path} --help)")
        return None
    import io

    import draccus
    from draccus.utils import DraccusException

    overrides = _bare_bool_flags(config_class, overrides)
    _refuse_bad_unicode(overrides)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), _without_help_text():
            return draccus.parse(config_class=config_class, args=overrides, prog=f"{PROG} {vf.path}")
    except DraccusException as e:
        raise VoyageError(f"config: {e}") from None
    except OSError as e:  # --config_path names a file that cannot be read
        raise VoyageError(f"config: cannot read {e.filename or ''}: {e.strerror or type(e).__name__}") from None
    except (ValueError, TypeError) as e:  # what draccus's decoders raise for a value they cannot read
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise VoyageError(f"config: {first} (see {PROG} {vf.path} --help)") from None
    except SystemExit:
        last = [line for line in err.getvalue().splitlines() if line.strip()]
        msg = last[-1].split("error: ", 1)[-1] if last else "bad arguments"
        raise VoyageError(f"{msg} (see {PROG} {vf.path} --help)") from None


def bool_flags(config_class: type | None) -> set[str]:
    """`--name` of every bool field of a config (nested ones dotted)."""
    import dataclasses
    import typing

    def bool_fields(cls: type, prefix: str) -> set[str]:
        out: set[str] = set()
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = hints.get(f.name)
            if kind is bool:
                out.add(prefix + f.name)
            elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
                out |= bool_fields(kind, f"{prefix}{f.name}.")
        return out

    return set() if config_class is None else {f"--{name}" for name in bool_fields(config_class, "")}


def _bare_bool_flags(config_class: type, args: list[str]) -> list[str]:
    """`--laptop` alone means `--laptop true` for a bool field (draccus wants the value)."""
    flags = bool_flags(config_class)
    out: list[str] = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg in flags and (i + 1 == len(args) or args[i + 1].startswith("--")):
            out.append("true")
    return out


def _refuse_bad_unicode(args: list[str]) -> None:
    """A lone surrogate (bytes of another encoding in a command line, read as text) has no
    identity: one line naming the flag."""
    for i, arg in enumerate(args):
        try:
            arg.encode()
        except UnicodeEncodeError as e:
            flag = arg if arg.startswith("--") else (args[i - 1] if i and args[i - 1].startswith("--") else "argument")
            raise VoyageError(f"{flag}: {arg!r} is not valid Unicode (a lone surrogate at position {e.start}: bytes of "
                              "another encoding; set a UTF-8 locale or pass the text in UTF-8)") from None


@contextlib.contextmanager
def _without_help_text() -> Iterator[None]:
    """Parsing a config with draccus, but without the help text of its fields: to build each
    field's help, draccus reads the config class's source with `inspect.getsource`, which parses
    the whole voyage file (0.25 s for a generated voyage of 3,000 steps), and only `--help`
    shows it. Its error messages (usage and the bad field) need none of it."""
    from draccus.wrappers import docstring

    real = getattr(docstring, "get_attribute_docstring", None)
    if real is None:  # another draccus: parse as it does, only slower
        yield
        return
    docstring.get_attribute_docstring = lambda *args, **kwargs: docstring.AttributeDocString()
    try:
        yield
    finally:
        docstring.get_attribute_docstring = real
