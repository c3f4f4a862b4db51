"""`tfxkit` console script: thin argument parsing over the runners."""

from __future__ import annotations

import argparse
import sys
import warnings

# Google client libraries warn about Python versions on import; not actionable here.
warnings.filterwarnings("ignore", category=FutureWarning)

from components.config import ConfigError, load_config
from components.data import DataError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tfxkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline locally")
    run.add_argument("--config", default="taxi", help="shipped config name (taxi, digits) or a YAML path")
    run.add_argument("--runner", default="beam", choices=["beam", "local"])
    run.add_argument("--output", default="runs", help="output directory (default: runs)")
    args = parser.parse_args(argv)

    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"tfxkit: invalid config: {e}", file=sys.stderr)
        return 2
    if args.command == "run":
        from pipelines import local_runner

        try:
            local_runner.run(config, args.output, runner=args.runner)
        except DataError as e:
            print(f"tfxkit: bad input data: {e}", file=sys.stderr)
            return 2
        except RuntimeError as e:
            print(f"tfxkit: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
