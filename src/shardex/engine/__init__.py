"""The export engine behind :func:`shardex.export`, one job per module, in the order an
export runs them:

* ``output``: what the output holds; modes, the intent record, legacy repair, clean-up;
* ``prepare``: pass 1, the source's references checked, split, labelled, keys selected
  (no image bytes read);
* ``plan``: each split's candidates, their exact tar sizes and name hash;
* ``write``: pass 2 over the splits through the backend (metadata.parquet streamed);
* ``shards``: a split's shard jobs, filled exactly, re-planned when bad samples are skipped;
* ``commit``: errors.parquet, the contract, config.yaml;
* ``run``: all of it under the output's lock (the internal entry point, with a runner).
"""
