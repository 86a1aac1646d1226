"""Model features from a step traced on the meta device (:mod:`~perfzoo.features.meta`: FLOPs, bytes,
parameters, layer counts, memory estimates; nothing is measured), the peak memory of the profiled step
replayed there (:mod:`~perfzoo.features.memory`) and the parallel featuriser of large imported tables
(:mod:`~perfzoo.features.pool`)."""
