"""The dataset: profiled traces joined with features and hardware into one row per measured config
(:mod:`~perfzoo.dataset.build`), imported measurement tables (:mod:`~perfzoo.dataset.external`,
:mod:`~perfzoo.dataset.timm`) and the named, seeded train/test splits (:mod:`~perfzoo.dataset.splits`)."""
