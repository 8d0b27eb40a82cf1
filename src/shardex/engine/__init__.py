"""The export engine behind :func:`shardex.export`, one job per module.

``write``: pass 2, shard jobs over a split's candidate samples, each sample's bytes read
once (checked, hashed, appended), shards filled exactly even when bad samples are skipped.
"""
