"""Model features from a step traced on the meta device (:mod:`~perfzoo.features.meta`: FLOPs, bytes,
parameters, layer counts, memory estimates; nothing is measured) and the parallel featuriser of large
imported tables (:mod:`~perfzoo.features.pool`)."""
