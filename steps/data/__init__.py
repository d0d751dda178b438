"""The data half of a voyage: ingest, train_tokenizer, tokenize, dedup and mixture step types.

Formats and the Ray-free readers the trainer uses live in `steps.data.formats` and
`steps.data.mixture` (the sampler); see docs/data.md.
"""
