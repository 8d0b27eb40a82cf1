"""The sample-reference model: what a source yields and a shard job carries (member
references, rows, candidates), with no dependence on the engine or a backend."""
