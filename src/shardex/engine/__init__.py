"""The export engine behind :func:`shardex.export`, one job per module, in the order an
export runs them:

* ``transaction``: the output as one run writes it (lock, intent, commit or abort),
  over ``output``: what the output holds, modes, legacy repair, clean-up;
* ``prepare``: pass 1, the source's references checked, split, labelled, keys selected
  (no image bytes read), batch by batch (``stream``, then ``finish``); bytes already in
  memory are pinned where they lie (``shardex.refs.pinned``);
* ``stream``: pass 1 batch by batch, each split's rows spilled to local scratch
  (``spill``), repeated keys found from hash runs; ``taken``: an append's keys;
* ``finish``: each split's spilled rows made final and sized, in a final spill;
* ``write``: pass 2 over the splits through the backend, each split planned (its exact
  shard sizes and name hash), metadata.parquet streamed (``parts``: by a remote task);
* ``shards``: a split's shard jobs, filled exactly, re-planned when bad samples are skipped;
* ``commit``: errors.parquet, the contract, config.yaml;
* ``run``: all of it under the output's lock (the internal entry point, with a runner).
"""
