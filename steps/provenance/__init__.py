"""Provenance of a voyage's artifacts: which checkpoints saw a document (`which_saw`), the
mixture's sampler run backwards (`inverse`), and the model card (`card`). Importing this package
imports neither torch nor Ray."""
