"""The ``perfzoo`` command line: ``perfzoo predict | audit | server | sensors | import``.

Exit codes (one table for every subcommand):

==== =========================================================================================
0    success
1    the run failed: ``audit`` found a broken provenance link, or an unexpected error (traceback)
2    bad input: a wrong option, model name, file or config (one line on stderr)
==== =========================================================================================

Start-up: ``perfzoo --help`` imports neither torch nor pandas; each subcommand imports what it needs when
it runs (the function-local imports below, each with its reason).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from perfzoo import __version__
from perfzoo.hardware.precision import PREDICTABLE
from perfzoo.sensors.command import add_sensors_parser, sensors_command

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT

PREDICT_EPILOG = """\
MODEL is timm:NAME, torchvision:NAME, mlp:NAME, transformer:NAME, language_model:PRESET (gpt2, gpt3-xl,
opt-1.3b, bert-large, llama, ...; --input is the sequence length) or path/to/model.py:function (a
factory returning an nn.Module; --input is then required).

examples:
  perfzoo predict timm:resnet50 --batch 8 --input 3,224,224
  perfzoo predict torchvision:vit_b_16 --mode training --batch 32 --objective energy --json
  perfzoo predict models/net.py:build --input 128 --devices a100,h100 --latency-target 20
  perfzoo predict timm:resnet50 --output resnet50.json && perfzoo audit resnet50.json
"""

AUDIT_EPILOG = """\
FILE is a prediction record (perfzoo predict --output, results/predictions/*.json) or any workflow output
(Parquet with provenance metadata, models.json, hardware/trace JSON, report/provenance.json). Each link of
its provenance chain is printed as OK, CHANGED or MISSING; the exit status is 1 if any link is broken.
"""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"perfzoo: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _add_predict_parser(sub: Any) -> None:
    p = sub.add_parser(
        "predict",
        help="predict a model on every device",
        epilog=PREDICT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument(
        "--input",
        dest="input_shape",
        metavar="SHAPE",
        help="per-sample input: 3,224,224 for images, a sequence length for token models "
        "(default 3,224,224 for timm/torchvision)",
    )
    p.add_argument("--mode", choices=("inference", "training"), default="inference")
    p.add_argument(
        "--precision",
        default="fp32",
        help=f"{', '.join(PREDICTABLE)} (default fp32): the hardware features of rows profiled at that precision",
    )
    p.add_argument("--devices", metavar="A,B", help="devices to predict (default: every configured device)")
    p.add_argument(
        "--objective",
        choices=("time", "energy", "edp", "cost"),
        default="time",
        help="what the recommended device minimises (default time)",
    )
    p.add_argument(
        "--latency-target",
        type=float,
        metavar="MS",
        dest="latency_target_ms",
        help="devices (and MIG profiles) slower than this are not recommended",
    )
    p.add_argument(
        "--results", default="results", metavar="DIR", help="workflow results folder (default results)"
    )
    p.add_argument(
        "--config", default="config.yaml", metavar="FILE", help="workflow config (default config.yaml)"
    )
    p.add_argument(
        "--num-classes",
        type=int,
        metavar="N",
        help="classifier head size (default: the config's zoo.num_classes)",
    )
    p.add_argument("--json", action="store_true", help="print the prediction record as JSON")
    p.add_argument("--output", metavar="FILE", help="also write the prediction record (JSON) to FILE")
    p.add_argument(
        "--no-server",
        action="store_true",
        help="featurise in a child process and start no warm featuriser server "
        "(also: PERFZOO_FEATURISER=local)",
    )


def _add_audit_parser(sub: Any) -> None:
    a = sub.add_parser(
        "audit",
        help="re-hash the provenance chain of a file",
        epilog=AUDIT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a.add_argument("file", metavar="FILE")
    a.add_argument(
        "--explain",
        action="store_true",
        help="list the profiled configurations nearest to a prediction instead",
    )
    a.add_argument("-k", type=int, default=5, help="rows per device for --explain (default 5)")
    a.add_argument("--json", action="store_true", help="print the result as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="perfzoo",
        description="Predict time, memory and energy of PyTorch models on the "
        "profiled devices, and audit any output back to its raw traces.",
    )
    parser.add_argument("--version", action="version", version=f"perfzoo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    _add_predict_parser(sub)
    s = sub.add_parser(
        "server",
        help="the warm featuriser server that keeps torch/timm imported between predictions",
    )
    s.add_argument("action", choices=("status", "start", "stop"))

    _add_audit_parser(sub)
    add_sensors_parser(sub)
    # parsed by perfzoo.dataset.external's own parser (see _import); listed here for --help
    sub.add_parser(
        "import",
        help="import an external measurement CSV or a timm benchmark CSV into a dataset table "
        "(perfzoo import --help)",
        add_help=False,
    )
    return parser


def _predict(args: argparse.Namespace) -> int:
    # lazy: perfzoo.prediction imports pandas and the workflow modules (~0.8 s CPU), not needed by --help
    from perfzoo.prediction import predict, server

    result = predict(
        args.model,
        batch=args.batch,
        input_shape=args.input_shape,
        mode=args.mode,
        precision=args.precision,
        devices=args.devices,
        objective=args.objective,
        latency_target_ms=args.latency_target_ms,
        results=args.results,
        config=args.config,
        num_classes=args.num_classes,
        use_server=not args.no_server and server.enabled(),
    )
    if args.output:
        result.save(args.output)
    print(result.to_json() if args.json else result.to_text())
    return EXIT_OK


def _audit(args: argparse.Namespace) -> int:
    # lazy: perfzoo.auditing imports pandas and pyarrow (~0.7 s CPU), not needed by --help
    from perfzoo.auditing import audit, explain, format_explain

    if args.explain:
        table = explain(args.file, k=args.k)
        if args.json:
            print(table.to_json(orient="records", indent=2))
        else:
            print(format_explain(table))
        return EXIT_OK
    result = audit(args.file)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.to_text())
    return EXIT_FAILURE if result.exit_code else EXIT_OK


def _server(args: argparse.Namespace) -> int:
    from perfzoo.prediction import server as fs  # lazy: perfzoo.prediction imports pandas (~0.8 s CPU)

    path = fs.socket_path()
    if path is None:
        print(
            "perfzoo: error: no private folder for the server socket (see XDG_RUNTIME_DIR)", file=sys.stderr
        )
        return EXIT_BAD_INPUT
    if args.action == "stop":
        print(f"stopped the server on {path}" if fs.stop_server(path) else f"no server on {path}")
    elif args.action == "start":
        state = _server_state(fs, path)
        print(
            f"server on {path} already {state}"
            if state != "not running"
            else f"starting the server on {path} (pid {fs.start_server()}; log {path.with_suffix('.log')})"
        )
    else:
        print(f"server on {path}: {_server_state(fs, path)}")
    return EXIT_OK


def _server_state(fs: types.ModuleType, path: Path) -> str:
    """"running, pid N", "starting, pid N" (its imports not yet made: not listening) or "not running"."""
    pid = fs.server_process(path)
    if fs.running(path):
        return f"running, pid {'?' if pid is None else pid}"
    return "not running" if pid is None else f"starting, pid {pid}"


def _import(argv: Sequence[str]) -> int:
    """``perfzoo import CSV -o OUT.parquet ...``: the importer's own command line (as ``perfzoo-import``)."""
    from perfzoo.dataset.external import external_main  # lazy: the importer imports pandas and scipy (~2 s CPU)

    return external_main(list(argv), prog="perfzoo import")


def _dispatch(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["import"]:  # its options belong to the importer's parser
        return _import(words[1:])
    args = build_parser().parse_args(words)
    commands = {"predict": _predict, "audit": _audit, "server": _server, "sensors": sensors_command}
    return commands[args.command](args)


def _run(argv: Sequence[str] | None) -> int:
    from perfzoo.io import InputError  # lazy: perfzoo.io imports pandas (~0.6 s CPU), not needed by --help

    try:
        return _dispatch(argv)
    except InputError as exc:
        print(f"perfzoo: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        print(f"perfzoo: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("perfzoo: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the exit status.

    Called without ``argv`` (the ``perfzoo`` console script, ``python -m perfzoo``) it parses
    ``sys.argv`` and, once the output is flushed, ends the process with ``os._exit``: tearing down an
    interpreter holding torch and scikit-learn costs about a second and there is nothing left to clean up.
    """
    code = _run(argv)
    if argv is not None:
        return code
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # output piped into `head` and the like
        pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
