"""Our checkpoints in and out of the Hugging Face format (docs/export.md).

- `to_hf.export_hf`: a training checkpoint -> a folder transformers and lm-eval load;
- `from_hf.import_hf`: such a folder -> a weights-only training checkpoint (midtrain, eval);
- `names`: our state-dict names <-> HF names, MoEConfig <-> config.json;
- `harness_hf`: lm-eval-harness's own `hf` model on an exported folder;
- `hf_files/`: the configuration and modeling files shipped in every export.

Importing this package, `steps.export.to_hf` or `steps.export.from_hf` imports no torch.
"""
