"""`tfxkit` console script: thin argument parsing over the runners."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

# Google client libraries warn about Python versions on import; not actionable here.
warnings.filterwarnings("ignore", category=FutureWarning)


def _config_help() -> str:
    # Listed from the directory: --help stays free of heavy imports.
    names = sorted(p.stem for p in (Path(__file__).parent / "configs").glob("*.yaml"))
    return f"shipped config name ({', '.join(names)}) or a YAML path"


def _version() -> str:
    from importlib import metadata

    try:
        return f"tfxkit {metadata.version('tfxkit')}"
    except metadata.PackageNotFoundError:
        return "tfxkit (version unknown: the package is not installed, only on the path)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tfxkit", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline locally")
    run.add_argument(
        "--config", default="fashion_mnist", help=_config_help() + " (default: fashion_mnist)"
    )
    run.add_argument(
        "--runner",
        default="beam",
        choices=["beam", "local"],
        help="TFX orchestrator: beam (BeamDagRunner, the default) or local (LocalDagRunner)",
    )
    run.add_argument("--output", default="runs", help="output directory (default: runs)")
    comp = sub.add_parser(
        "compile", help="compile for Kubeflow Pipelines (KFP v2 YAML with node-pool placement)"
    )
    comp.add_argument("--config", required=True, help=_config_help())
    comp.add_argument("--output", required=True, help="the .yaml file to write")
    submit = sub.add_parser(
        "submit", help="upload a pipeline to Kubeflow Pipelines through kfp.Client"
    )
    source = submit.add_mutually_exclusive_group(required=True)
    source.add_argument("--package", help="a compiled pipeline .yaml")
    source.add_argument("--config", help="compile this config first, then upload it")
    submit.add_argument(
        "--host", required=True, help="KFP API endpoint, e.g. http://localhost:8080"
    )
    submit.add_argument(
        "--name", help="pipeline name in KFP (default: the config's name or the file's stem)"
    )
    submit.add_argument(
        "--version", help="version name when the pipeline exists (default: file name + time)"
    )
    submit.add_argument(
        "--run", action="store_true", help="also start a run of the uploaded version"
    )
    submit.add_argument(
        "--experiment", default="Default", help="experiment of the run (default: Default)"
    )
    submit.add_argument("--namespace", help="Kubeflow profile namespace (multi-user deployments)")
    sub.add_parser(
        "schema", help="print the JSON Schema of a config file (for editors and checkers)"
    )
    args = parser.parse_args(argv)

    # Imported after parsing so that `--help` stays fast; TensorFlow only once
    # the checks that need none of it have passed.
    from components.config import ConfigError
    from pipelines.configs import load_config, schema_text

    if args.command == "schema":
        sys.stdout.write(schema_text())
        return 0
    if args.command == "submit":
        return _submit(args)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"tfxkit: invalid config: {e}", file=sys.stderr)
        if args.command == "run":
            from pipelines import rundir

            # This run's own record, so the previous run's result does not stand for it.
            rundir.record_refusal(args.output, rundir.CONFIG_CHECK_STAGE, f"ConfigError: {e}")
        return 2
    if args.command == "compile":
        from pipelines import precheck

        try:
            precheck.check_for_cluster(config)
        except ConfigError as e:
            print(f"tfxkit: cannot compile: {e}", file=sys.stderr)
            return 2
        from pipelines import kubeflow_runner

        try:
            compiled = kubeflow_runner.compile_pipeline(config, args.output)
        except ConfigError as e:
            print(f"tfxkit: cannot compile: {e}", file=sys.stderr)
            return 2
        print(
            f"tfxkit: wrote {compiled.path} ({len(compiled.pipeline_spec.root.dag.tasks)} components)"
        )
        if compiled.flink_path:
            print(
                f"tfxkit: wrote {compiled.flink_path}: the Flink session cluster and Beam job "
                "server its Beam stages submit to; kubectl apply it first"
            )
        return 0
    if args.command == "run":
        return _run(config, args.output, args.runner)
    return 0


def _run(config, output: str, runner: str) -> int:
    """`run`: the output directory is checked, locked and logging to its file
    before TensorFlow is imported, so library start-up lines land in the log."""
    from pipelines import rundir

    try:
        output = rundir.check_output_dir(output)
        with rundir.exclusive_run(output), rundir.log_to_file(output) as run_log:
            from components.config import ConfigError
            from components.data.sources import DataError, check_data_path
            from pipelines import precheck

            try:
                precheck.check_beam_args(config.beam_args)
            except ConfigError as e:
                rundir.write_refusal(
                    output,
                    {
                        **rundir.refused_summary(rundir.CONFIG_CHECK_STAGE, f"ConfigError: {e}"),
                        "log": run_log.path,
                    },
                )
                print(f"tfxkit: ConfigError: {e}", file=run_log.file)
                print(f"tfxkit: invalid config: {e}", file=run_log.err)
                return 2
            try:
                check_data_path(config.data)
            except DataError as e:
                error = f"DataError: {e}"
                summary = rundir.refused_summary(rundir.INPUT_CHECK_STAGE, error)
                rundir.write_refusal(output, {**summary, "log": run_log.path})
                print(f"tfxkit: {error}", file=run_log.file)
                print(f"tfxkit: bad input data: {e}", file=run_log.err)
                return 2
            from pipelines import local_runner

            try:
                local_runner.run(config, output, runner=runner, stream=run_log.out)
            except DataError as e:
                print(f"tfxkit: bad input data: {e}", file=run_log.err)
                return 2
            except RuntimeError as e:
                print(f"tfxkit: {e}", file=run_log.err)
                print(f"tfxkit: the full log is {run_log.path}", file=run_log.err)
                return 1
            except KeyboardInterrupt:
                # The runner stopped what it started (a local tf.data service) on the way out.
                print("tfxkit: interrupted", file=run_log.err)
                print(f"tfxkit: the full log is {run_log.path}", file=run_log.err)
                return 130
    except rundir.OutputDirError as e:
        print(f"tfxkit: {e}", file=sys.stderr)
        return 2
    except rundir.ConcurrentRunError as e:
        print(f"tfxkit: {e}", file=sys.stderr)
        return 1
    return 0


def _submit(args) -> int:
    """`submit`: compile when given a config, then upload (and optionally run)."""
    import os
    import tempfile

    from components.config import ConfigError
    from components.kubernetes import submit
    from pipelines.configs import load_config

    with tempfile.TemporaryDirectory() as tmp:
        package, name = args.package, args.name
        try:
            if args.config:
                from pipelines import precheck

                config = load_config(args.config)
                precheck.check_for_cluster(config)
                from pipelines import kubeflow_runner

                package = kubeflow_runner.compile_pipeline(
                    config, os.path.join(tmp, f"{config.name}.yaml")
                ).path
                if config.kubeflow.flink is not None:
                    print(
                        "tfxkit: kubeflow.flink: the Beam stages submit to the Flink session "
                        "cluster `tfxkit compile` writes manifests for (X.flink.yaml beside "
                        "X.yaml); submit does not create it: apply those first",
                        file=sys.stderr,
                    )
                name = name or config.name
            elif not os.path.isfile(package):
                raise ConfigError(
                    f"--package: {package!r} does not exist; compile it first (tfxkit compile)"
                )
        except ConfigError as e:
            print(f"tfxkit: cannot compile: {e}", file=sys.stderr)
            return 2
        name = name or os.path.splitext(os.path.basename(package))[0]
        try:
            ids = submit.submit(
                package,
                args.host,
                name,
                version_name=args.version,
                run=args.run,
                experiment=args.experiment,
                namespace=args.namespace,
            )
        except Exception as e:  # noqa: BLE001 - kfp raises transport and API errors of many types
            print(f"tfxkit: submit to {args.host} failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    print("tfxkit: submitted " + ", ".join(f"{k}={v}" for k, v in ids.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
