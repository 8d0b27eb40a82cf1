"""Byte fetching for sources and shard jobs: ranged and coalesced object reads
(:mod:`~shardex.storage.fetch.objects`), tars read by range or stream and their local
copies (:mod:`~shardex.storage.fetch.tars`), and tar parts a runner holds
(:mod:`~shardex.storage.fetch.held`)."""
