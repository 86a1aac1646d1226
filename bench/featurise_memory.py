"""Peak RSS of featurising a multi-billion-parameter transformer on the meta device.

Builds perfzoo's token classifier (embedding + ``nn.TransformerEncoder``) at a 7B-class size
(d_model 4096, 32 layers, 32 heads, feed-forward 4x, vocabulary 32,000) through a factory file, and
featurises it in a fresh interpreter per mode, as ``perfzoo predict`` does, printing the parameter
count, FLOPs per step, wall time and the process's peak resident set size (``ru_maxrss``). Its fp32
weights alone would need ~26 GB; on the meta device none are allocated.

    python bench/featurise_memory.py [--layers 32] [--d-model 4096] [--seq 2048] [--batch 8]

With ``--presets``, the language-model presets of the ``language_model`` builder are featurised instead
(``language_model:<preset>``, e.g. GPT-3 XL at 1.3 B and the LLaMA-style 7 B preset):

    python bench/featurise_memory.py --presets gpt3-xl llama --seq 2048 --batch 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, sys, time
start = time.perf_counter()
from perfzoo.prediction.metamodel import featurise_model
from perfzoo.prediction.spec import resolve_model
spec = resolve_model(sys.argv[1], sys.argv[2])
out = featurise_model(spec, int(sys.argv[3]), sys.argv[4], 1000)
print(json.dumps({"params": out["features"]["params"], "flops": out["features"]["flops"],
                  "seconds": time.perf_counter() - start,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--presets", nargs="+", default=[], help="language_model presets to featurise instead")
    parser.add_argument("--limit-mb", type=float, default=1024.0)
    args = parser.parse_args(argv)
    models = [f"language_model:{preset}" for preset in args.presets] or [token_classifier_factory(args)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}
    worst = 0.0
    for model in models:
        for mode in ("inference", "training"):
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, model, str(args.seq), str(args.batch), mode],
                capture_output=True, text=True, env=env, check=False,
            )
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 2
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            worst = max(worst, r["peak_rss_mb"])
            print(
                f"{model.rpartition('/')[2]} {mode}: {r['params'] / 1e9:.2f} B parameters "
                f"({r['params'] * 4 / 1e9:.1f} GB as fp32), {r['flops']:.3g} FLOPs per step at batch {args.batch} "
                f"x {args.seq} tokens; featurised in {r['seconds']:.1f} s with peak RSS {r['peak_rss_mb']:.0f} MB"
            )
    print(f"largest peak RSS {worst:.0f} MB: {'within' if worst <= args.limit_mb else 'ABOVE'} {args.limit_mb:g} MB")
    return 0 if worst <= args.limit_mb else 1


def token_classifier_factory(args: argparse.Namespace) -> str:
    """A factory file building the token classifier at the requested size; returns its ``file:function``."""
    factory = Path(tempfile.mkdtemp(prefix="perfzoo-bench-")) / "big_transformer.py"
    factory.write_text(
        "from perfzoo.models.builders import TokenClassifier\n\n\ndef build():\n"
        f"    return TokenClassifier(num_classes=1000, d_model={args.d_model}, heads={args.heads}, "
        f"layers={args.layers}, vocab=32000, max_len={max(args.seq, 4096)}, dropout=0.0)\n"
    )
    return f"{factory}:build"


if __name__ == "__main__":
    sys.exit(main())
