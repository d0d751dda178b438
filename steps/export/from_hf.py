"""`import_hf`: a Hugging Face folder of our architecture (an `export_hf` output, or one edited or
fine-tuned elsewhere) as a training checkpoint, so midtraining or eval can start from it.

    imp = Step("import/base", import_hf, ImportHFConfig(hf=output_of(export_step)))
    mid = Step("midtrain/from-hf", midtrain, dataclasses.replace(train, init_from=output_of(imp)))
    ev = Step("eval/from-hf", evaluate, EvalConfig(checkpoint=output_of(imp), mixture=output_of(mix)))

The output is a checkpoint folder like a training step's, `checkpoints/step-0/` (DCP, model only,
fp32 as the trainer keeps its weights) with a meta.json that says `weights_only: true`: a
midtrain step that starts from it loads the weights into a fresh optimizer and begins at its own
first step (docs/export.md). The names are read backwards through steps/export/names.py; the
routed experts' per-expert HF tensors are stacked back into one [E, ...] tensor per layer.
Tensors are read one at a time (by byte range, on any fsspec URL) and written one at a time.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

from executor import StepContext, VoyageError, step_type

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass(frozen=True)
class ImportHFConfig:
    """Import the Hugging Face folder `hf` (config.json of model_type marin_moe + safetensors), or
    the folder of an export_hf output (its `hf/`)."""

    hf: str


@step_type(version="1")
def import_hf(config: ImportHFConfig, ctx: StepContext) -> None:
    """Write the HF folder's weights as `checkpoints/step-0` (weights only) of this output."""
    from steps.train import checkpoint

    started = time.time()
    from steps.export.to_hf import hf_folder

    summary = import_folder(hf_folder(config.hf), checkpoint.folder(ctx.output, 0))
    ctx.results.update(checkpoint=checkpoint.folder(ctx.output, 0), wall_s=time.time() - started, **summary)


def read_hf_config(hf: str) -> dict[str, Any]:
    import fsspec

    url = f"{hf.rstrip('/')}/config.json"
    try:
        with fsspec.open(url, "r") as f:
            return json.load(f)
    except FileNotFoundError as e:
        raise VoyageError(f"import: no config.json in {hf}") from e


def weight_files(hf: str) -> dict[str, Any]:
    """{file name: SafetensorsFile} of the folder's weights (sharded with an index, or one file)."""
    import fsspec

    from steps.export.safetensors_io import SafetensorsFile

    base = hf.rstrip("/")
    fs, path = fsspec.core.url_to_fs(base)
    if fs.exists(f"{path}/{INDEX}"):
        with fs.open(f"{path}/{INDEX}", "r") as f:
            weight_map = json.load(f)["weight_map"]
        names = sorted(set(weight_map.values()))
    elif fs.exists(f"{path}/{SINGLE}"):
        weight_map, names = None, [SINGLE]
    else:
        raise VoyageError(f"import: {hf} has neither {INDEX} nor {SINGLE}")
    files = {}
    for name in names:
        try:
            files[name] = SafetensorsFile(f"{base}/{name}")
        except FileNotFoundError as e:
            raise VoyageError(f"import: {hf}: {name} is named by {INDEX} but missing") from e
        except (ValueError, KeyError, UnicodeDecodeError) as e:
            raise VoyageError(f"import: {hf}: {name} is not a whole safetensors file: {e}") from e
    if weight_map is not None:
        for tensor, name in weight_map.items():
            if tensor not in files[name].entries:
                raise VoyageError(f"import: {hf}: {INDEX} puts {tensor} in {name}, which does not hold it")
    return files


def import_folder(hf: str, out: str) -> dict[str, Any]:
    """Write the HF folder `hf` as a weights-only DCP checkpoint folder `out` with its meta.json."""
    import fsspec
    import torch

    from steps.export.dcp_io import write_checkpoint
    from steps.export.names import fqn_of, is_routed, moe_config
    from steps.export.safetensors_io import iter_folder
    from steps.moe.model import MoETransformer

    hf_cfg = read_hf_config(hf)
    cfg = moe_config(hf_cfg, hf)
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in MoETransformer(cfg).state_dict().items()}
    sources: dict[str, dict[int | None, tuple[str, Any]]] = {}
    for name, f in iter_folder(weight_files(hf)):
        fqn, expert = fqn_of(name)
        if fqn not in want:
            raise VoyageError(f"import: {hf}: {name} maps to {fqn}, which the model of its config.json lacks")
        expect = want[fqn] if expert is None else want[fqn][1:]
        if f.shape(name) != expect:
            raise VoyageError(f"import: {hf}: {name} has shape {f.shape(name)}, the config says {expect}")
        if expert is not None and not 0 <= expert < want[fqn][0]:
            raise VoyageError(f"import: {hf}: {name} names expert {expert} of {want[fqn][0]}")
        if expert in sources.setdefault(fqn, {}):
            raise VoyageError(f"import: {hf}: {name} appears twice")
        sources[fqn][expert] = (name, f)
    for fqn, shape in want.items():
        have = sources.get(fqn, {})
        need = range(shape[0]) if is_routed(fqn) else [None]
        missing = [e for e in need if e not in have]
        if missing:
            what = f"experts {missing[:4]}{' ...' if len(missing) > 4 else ''} of " if missing != [None] else ""
            raise VoyageError(f"import: {hf} lacks {what}{fqn}")

    def produce(fqn: str) -> torch.Tensor:
        parts = sources[fqn]
        if None in parts:
            name, f = parts[None]
            return f.read(name).to(torch.float32)
        out_t = torch.empty(want[fqn], dtype=torch.float32)
        for e, (name, f) in parts.items():
            out_t[e] = f.read(name)
        return out_t

    write_checkpoint(out, {fqn: (shape, torch.float32) for fqn, shape in want.items()}, produce)
    context = int(hf_cfg.get("max_position_embeddings") or cfg.max_seq_len)
    meta = {"step": 0, "tokens": 0, "phase": "import", "weights_only": True, "source": hf,
            "model": dataclasses.asdict(cfg), "mixture": None, "batch_size": 0, "seq_len": context + 1,
            "world_size": 1, "metrics": {}, "time": time.time()}
    from steps.train.checkpoint import FILES, folder_digests

    meta[FILES] = folder_digests(out)  # verified on load, as the trainer's own checkpoints
    with fsspec.open(f"{out.rstrip('/')}/meta.json", "w") as f:  # last: the folder is a checkpoint from now on
        json.dump(meta, f, indent=1, sort_keys=True)
    return {"tensors": sum(len(v) for v in sources.values()), "parameters": sum(_numel(s) for s in want.values())}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------------------------------------
# Starting a training phase from an imported checkpoint (steps/train/pretrain.py and loop.py).

# MoEConfig fields that do not change the function the weights compute.
_TRAINING_ONLY = ("router_impl", "z_loss_coef", "aux_loss_coef", "bias_update_rate", "max_seq_len", "init_std",
                  "expert_align")


def check_weights_only(meta: dict[str, Any], model_config: Any, field: str) -> None:
    """VoyageError naming `field` when an imported checkpoint's model computes another function
    than `model_config` (a window, a theta, a router setting: what shapes alone do not show)."""
    differ = [f"{k}: {v!r} vs {getattr(model_config, k)!r}" for k, v in sorted(meta["model"].items())
              if k not in _TRAINING_ONLY and hasattr(model_config, k) and getattr(model_config, k) != v]
    if differ:
        raise VoyageError(f"{field}: the imported model is not the one configured (imported vs configured: "
                          f"{'; '.join(differ[:4])}{' ...' if len(differ) > 4 else ''})")


def start_schedule_at(scheduler: Any, step: int) -> None:
    """Put a fresh LambdaLR at optimizer step `step`, as if it had been stepped that many times
    (a phase that starts from imported weights keeps the run's schedule)."""
    import warnings

    scheduler.last_epoch = step - 1
    with warnings.catch_warnings():  # no optimizer step has been taken yet, on purpose
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        scheduler.step()
