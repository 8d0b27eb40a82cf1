"""The export engine behind :func:`shardex.export`, one job per module, in the order an
export runs them:

* ``output``: what the output holds; modes, the intent record, legacy repair, clean-up;
* ``prepare``: pass 1, the source's references checked, split, labelled, keys selected
  (no image bytes read), batch by batch (``stream``, then ``finish``); bytes already in
  memory are pinned where they lie (``shardex.refs.pinned``);
* ``stream``: pass 1 batch by batch, each split's rows spilled to local scratch
  (``spill``; ``scratch``), repeated keys found from hash runs (``runs``);
* ``finish``: each split's spilled rows made final and sized, in a final spill;
* ``plan``: each split's candidates, their exact tar sizes and name hash;
* ``write``: pass 2 over the splits through the backend (metadata.parquet streamed);
* ``shards``: a split's shard jobs, filled exactly, re-planned when bad samples are skipped;
* ``candidates``: the samples a shard job may take (a slice of the split's spill);
* ``split_index``: a split's index files from records and key runs on scratch;
* ``commit``: errors.parquet, the contract, config.yaml;
* ``run``: all of it under the output's lock (the internal entry point, with a runner).
"""
