"""lm-eval-harness's own `hf` model (HFLM: transformers' AutoModelForCausalLM and AutoTokenizer,
`trust_remote_code=True`) on an exported folder: the ecosystem's path, beside our adapter
(steps/eval/harness.py), with the same task settings.

Needs the `eval` extra (lm-eval, transformers, accelerate). A folder on an object store is copied
to a local temporary folder first (transformers reads local folders or the hub).
"""
from __future__ import annotations

import contextlib
import tempfile
from typing import Any, Iterator

from executor import VoyageError


@contextlib.contextmanager
def local_folder(url: str) -> Iterator[str]:
    """A local path holding the folder at `url` (the folder itself when it is local)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="hf-export-") as tmp:
        fs.get(path.rstrip("/") + "/", tmp, recursive=True)
        yield tmp


def run_hf_tasks(folder: str, cfg: Any, device: Any, batch_size: int) -> dict[str, Any]:
    """Run the tasks of `cfg` (a steps.eval.evaluate.HarnessConfig) with lm-eval's `hf` model on the
    exported folder; returns the per-task metrics as `steps.eval.harness.run_tasks` does."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise VoyageError("harness.hf_model: needs lm-eval with transformers and accelerate "
                          "(pip install -e '.[eval]')") from e
    manager = TaskManager(include_path=cfg.include_path, include_defaults=cfg.include_path is None)
    from steps.export.to_hf import hf_folder

    with local_folder(hf_folder(folder)) as path:
        # HFLM generates up to 256 tokens unless the task's generation_kwargs say max_gen_toks.
        model_args = {"pretrained": path, "trust_remote_code": True, "device": str(device), "dtype": "auto"}
        out = lm_eval.simple_evaluate(model="hf", model_args=model_args, tasks=list(cfg.tasks),
                                      num_fewshot=cfg.num_fewshot, limit=cfg.limit, batch_size=batch_size,
                                      task_manager=manager, log_samples=False, bootstrap_iters=0)
    return {task: {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
            for task, metrics in (out or {}).get("results", {}).items()}
