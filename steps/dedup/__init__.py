"""Deduplication: exact and MinHash LSH across all shards of one or several sources, in passes of
Ray tasks (docs/data.md "dedup"): `dedup` the step, `minhash` the signatures and band keys,
`runs` the sorted runs of pass 1, `pairs` pass 2, `components` pass 3.
"""
