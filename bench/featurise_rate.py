"""Featurisation rate (models/s) of the default zoo's configs on the meta device."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from perfzoo.config import load_config  # noqa: E402
from perfzoo.features import featurise_manifest  # noqa: E402
from perfzoo.zoo import expand_zoo, manifest_frame  # noqa: E402


def main() -> None:
    config = load_config(ROOT / "config.yaml")
    manifest = manifest_frame(expand_zoo(config))
    featurise_manifest(manifest.head(2), config["zoo"]["num_classes"], progress=False)  # warm imports
    start = time.perf_counter()
    models, layers = featurise_manifest(manifest, config["zoo"]["num_classes"], progress=False)
    elapsed = time.perf_counter() - start
    print(f"featurised {len(models)} (model, mode, batch) configs, {len(layers)} layer rows "
          f"in {elapsed:.1f} s: {len(models) / elapsed:.2f} configs/s")
    for mode, g in models.groupby("mode"):
        print(f"  {mode}: {len(g)} configs")


if __name__ == "__main__":
    main()
