"""Profiling stage: measure every config of a shard on one device, each in an isolated worker.

``core`` (Measurement, step, stopping rule, worker start) is imported by ``measure`` (cpu), ``cuda`` and
``layers``; ``worker`` runs one of them in a fresh process; ``interference`` judges whether the machine
was quiet; ``runner`` drives a shard; ``microbench`` checks the device and measures its hardware record;
``nvml`` is the NVIDIA management library boundary."""
