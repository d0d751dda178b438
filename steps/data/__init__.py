"""The data half of a voyage: ingest, train_tokenizer, tokenize, decontaminate and mixture step types (dedup is `steps.dedup`).

Formats and the Ray-free readers the trainer uses live in `steps.data.formats` and
`steps.data.mixture` (the sampler); see docs/data.md.
"""
