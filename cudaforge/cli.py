"""The `cudaforge` command. Exit codes: 0 done, 1 the work failed (e.g. a kernel was wrong),
2 bad usage or input, 3 a needed resource is missing (GPU, library, API key)."""

from __future__ import annotations

import argparse
import json
import sys

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MISSING = 0, 1, 2, 3


def cmd_doctor(args) -> int:
    from .doctor import doctor, format_report

    report = doctor()
    print(json.dumps(report, indent=2, default=str) if args.json else format_report(report))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cudaforge", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("doctor", help="what this machine offers: driver, CUDA, NVRTC, CUPTI, GPUs")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=cmd_doctor)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("cudaforge: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        from .errors import LibraryNotFound, NeedsKeyError, NoGPUError

        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"cudaforge: error: {type(exc).__name__}: {first}", file=sys.stderr)
        if isinstance(exc, (NoGPUError, LibraryNotFound, NeedsKeyError)):
            return EXIT_MISSING
        if isinstance(exc, (ValueError, FileNotFoundError, TypeError)):
            return EXIT_USAGE
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
