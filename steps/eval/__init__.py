"""Evaluation: the `eval` step (held-out loss and bits per byte beside the unigram baseline), and
lm-eval-harness over our checkpoints (`harness`) or through transformers on an export (`harness_hf`)."""
