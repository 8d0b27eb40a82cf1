"""Byte fetching for sources and shard jobs: coalesced object reads (``objects``), tars
read by range or stream with local copies (``tars``), and tar parts Ray holds (``held``)."""
