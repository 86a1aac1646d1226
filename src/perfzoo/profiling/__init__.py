"""Profiling stage: measure every config of a shard on one device, each in an isolated worker."""
