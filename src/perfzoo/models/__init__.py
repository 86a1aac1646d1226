"""The model zoo: which models are profiled (families, variants, stable ids), how each is built
(:mod:`~perfzoo.models.builders`: timm, torchvision, built-in MLP/transformer, a user's Python file) and
which user files a model depends on (:mod:`~perfzoo.models.files`)."""
