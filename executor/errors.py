"""The errors the executor raises on bad input.

Every bad voyage, config, flag or prefix becomes one `VoyageError` with one line that names the
problem (field path, step name, file and line); `marin-run` prints it and exits 2 before anything
is written.
"""


class VoyageError(Exception):
    """A voyage, config, flag or prefix that cannot be planned or run. Exit code 2."""


class IdentityError(VoyageError):
    """A config value that has no canonical encoding (unknown type, NaN, ...)."""
