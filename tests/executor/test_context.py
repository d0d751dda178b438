"""Issue 20 item 3: a step's files are its own. `ctx.open`/`ctx.path` refuse a path that would
leave the step's output folder or name one of the executor's files, with one clear error."""

import pytest

from executor import VoyageError
from executor.context import StepContext


@pytest.fixture
def ctx(tmp_path):
    return StepContext(name="s", output=str(tmp_path / "s-0123456789" / ".attempts" / "0001-abcdef12"), digest="0" * 64)


@pytest.mark.parametrize("path, why", [
    ("../x", "'..' segment"),
    ("sub/../../x", "'..' segment"),
    ("..", "'..' segment"),
    ("/etc/passwd", "is absolute"),
    ("gs://bucket/x", "is absolute"),
    (".status", "executor's files"),
    ("./.lease", "executor's files"),
    (".step.json", "executor's files"),
    ("deep/.attempts/x", "executor's files"),
])
def test_paths_that_leave_the_folder_or_name_executor_files_are_refused(ctx, tmp_path, path, why):
    for call in (lambda: ctx.open(path, "w"), lambda: ctx.open(path, "rb"), lambda: ctx.path(path),
                 lambda: ctx.fs_path(path), lambda: ctx.exists(path)):
        with pytest.raises(VoyageError, match=why) as e:
            call()
        assert "step s: ctx path" in str(e.value) and "\n" not in str(e.value)
    assert not list(tmp_path.rglob("x")) and not list(tmp_path.rglob(".status"))


def test_paths_inside_the_folder_still_work(ctx):
    with ctx.open("a/b/./c.txt", "w") as f:
        f.write("ok")
    assert ctx.exists("a/b/c.txt") and ctx.path("a", "b/c.txt").endswith("/0001-abcdef12/a/b/c.txt")
    with ctx.open(".tmp-123-c.txt", "w") as f:  # the atomic-write convention stays allowed
        f.write("tmp")
