"""How the Beam stages' cost grows with rows: ExampleGen -> StatisticsGen -> SchemaGen ->
Transform on taxi-like data of 10^4, 10^5 and 10^6 rows.

The pipeline is the first four stages of TFX's taxi native-Keras example (its CSV
ExampleGen, StatisticsGen, SchemaGen with shape inference as the example has it, and the Transform of its
module file), stock (`stock`) and with the swap's Transform (`product`: the product's,
the same `preprocessing_fn`), so both sides do the same work. Runners: `in_process` (Beam's
in-process runner, one worker), `multi_processing` (`--direct_running_mode
multi_processing --direct_num_workers 2`), both pinned to the in-process switch without a
Prism download (`components.compat.beam_runner`), and `prism` (Beam's Prism runner, the
product's side, at 10^4 and 10^5 rows; `make prism` builds it).

The data: rows of the example's own CSV drawn with replacement, each float column's
values scaled by 1 + N(0, 0.01) (missing cells stay missing), so vocabularies and
quantiles see the taxi distribution at every size. Each run is a fresh child process;
its wall time, the CPU seconds of its whole process tree (`RUSAGE_CHILDREN`: every worker
it waited for) and the peak resident memory of the tree (summed over its live processes,
sampled every 0.25 s from /proc) are recorded, and the peak inside each stage's execution
(its start and end as ML Metadata recorded them: `peak_rss_mb_by_stage`), which names
the stage that holds rows in memory. One run per configuration and size, the
configurations' order rotated at each size; at the largest size the in-process product and
stock runs are repeated as `--pairs` pairs (order alternated) for the ratio's interval.

JSON lines, one per run, a summary (`marginal_exponents`: the slope between the two
largest sizes, where the fixed start-up cost weighs least), then the headline: `exponents` (per configuration, the
least-squares slope of log wall time on log rows), `peak_memory_ratio_1e6_over_1e5` (per
configuration) and `total_ratio_product_over_stock_1e6` (per runner, wall time; the
geometric mean of the pairs' ratios where there are pairs, its 95% interval on the
summary line). Targets:
exponents <= 1.1, memory ratio <= 2, product / stock <= 1.0. Results in
`benchmarks/results/scale.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

ROWS = (10_000, 100_000, 1_000_000)
PRISM_ROWS = (10_000, 100_000)
SIDES = ("product", "stock")
RUNNERS = ("in_process", "multi_processing", "prism")
KEEP = ("CsvExampleGen", "StatisticsGen", "SchemaGen", "Transform")
RUN_TIMEOUT_S = 3600
HEADLINE_KEYS = (
    "exponents",
    "peak_memory_ratio_1e6_over_1e5",
    "total_ratio_product_over_stock_1e6",
)


def write_rows(path: str, rows: int, seed: int = 0) -> None:
    """`rows` taxi-like rows (see the module docstring) as a CSV at `path`."""
    import csv

    import numpy as np

    from testkit import tfx_examples

    with open(os.path.join(tfx_examples.TAXI_DATA, "data.csv")) as f:
        reader = csv.reader(f)
        header = next(reader)
        source = list(reader)
    floats = [
        i
        for i in range(len(header))
        if all(not r[i] or _is_float(r[i]) for r in source[:500])
        and any("." in r[i] for r in source[:500])
    ]
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for start in range(0, rows, 50_000):
            count = min(50_000, rows - start)
            picks = rng.integers(0, len(source), count)
            scales = 1.0 + 0.01 * rng.standard_normal((count, len(floats)))
            for row_index, pick in enumerate(picks):
                row = list(source[pick])
                for j, col in enumerate(floats):
                    if row[col]:
                        row[col] = repr(float(row[col]) * float(scales[row_index, j]))
                writer.writerow(row)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def beam_args(runner: str) -> list[str]:
    if runner == "multi_processing":
        return ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    if runner == "prism":
        from testkit import prism

        location = prism.location()
        if location is None:
            raise RuntimeError("Prism is not built: make prism")
        return prism.beam_args(location)
    # Non-empty like the others: TFX's Beam executors package TFX for any non-empty args.
    return ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def child(spec: dict) -> None:
    """One run: the example's first four stages, on `spec`'s side, runner and data."""
    from tfx.components import CsvExampleGen, SchemaGen, StatisticsGen
    from tfx.orchestration import metadata, pipeline
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    from components.compat import beam_runner
    from testkit import tfx_examples

    if spec["side"] == "product":
        # The two-import swap's Transform (testkit.tfx_examples.TAXI.swap).
        from components.transform.component import Transform
    else:
        from tfx.components import Transform
    example_gen = CsvExampleGen(input_base=spec["data_root"])
    statistics = StatisticsGen(examples=example_gen.outputs["examples"])
    schema = SchemaGen(statistics=statistics.outputs["statistics"], infer_feature_shape=True)
    transform = Transform(
        examples=example_gen.outputs["examples"],
        schema=schema.outputs["schema"],
        module_file=tfx_examples.TAXI.module_file,
    )
    root = spec["root"]
    run = pipeline.Pipeline(
        pipeline_name=f"scale_{spec['side']}",
        pipeline_root=os.path.join(root, "pipeline_root"),
        components=[example_gen, statistics, schema, transform],
        metadata_connection_config=metadata.sqlite_metadata_connection_config(
            os.path.join(root, "metadata.db")
        ),
        beam_pipeline_args=beam_args(spec["runner"]),
    )
    with beam_runner.local_by_default():
        BeamDagRunner().run(run)
    done = set(os.listdir(os.path.join(root, "pipeline_root")))
    if not set(KEEP) <= done:
        raise RuntimeError(f"not every stage ran: {sorted(set(KEEP) - done)}")


def _tree_rss_bytes(root_pid: int) -> int:
    """Resident bytes of `root_pid` and every live descendant (0 once it is gone)."""
    from testkit import results

    try:
        tree = results.process_tree_stats("/proc", root_pid)
    except OSError:
        return 0
    return sum(int(fields[21]) for fields in tree.values()) * os.sysconf("SC_PAGE_SIZE")


def stage_windows(metadata_path: str) -> dict[str, tuple[float, float]]:
    """Each execution's (start, end) in seconds since the epoch, by its type's short name."""
    from ml_metadata import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    store = metadata_store.MetadataStore(config)
    types = {t.id: t.name.rsplit(".", 1)[-1] for t in store.get_execution_types()}
    return {
        types[e.type_id]: (e.create_time_since_epoch / 1e3, e.last_update_time_since_epoch / 1e3)
        for e in store.get_executions()
    }


def stage_peaks(
    samples: list[tuple[float, int]], windows: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """The largest sampled tree RSS (MB) inside each stage's window; None when no sample fell in it."""
    peaks = {}
    for stage, (start, end) in sorted(windows.items(), key=lambda item: item[1]):
        inside = [rss for t, rss in samples if start <= t <= end]
        peaks[stage] = round(max(inside) / 2**20, 1) if inside else None
    return peaks


def measure(spec: dict, log_path: str) -> dict:
    """Runs `child(spec)` in a fresh process; its wall, tree CPU, tree peak RSS and each stage's peak."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            text=True,
        )
        samples: list[tuple[float, int]] = []
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                samples.append((time.time(), _tree_rss_bytes(proc.pid)))
                stop.wait(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            proc.communicate(json.dumps(spec), timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            stop.set()
            sampler.join()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"run {spec} failed ({proc.returncode}):\n{tail}")
    windows = stage_windows(os.path.join(spec["root"], "metadata.db"))
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "peak_rss_mb": round(max(rss for _, rss in samples) / 2**20, 1),
        "peak_rss_mb_by_stage": stage_peaks(samples, windows),
    }


def slope(rows: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) on log(rows)."""
    xs = [math.log(r) for r in rows]
    ys = [math.log(s) for s in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def _first_runs(runs: list[dict]) -> list[dict]:
    """The runs of the size sweep (a repeated pair's later runs, `pair` >= 1, left out)."""
    return [run for run in runs if not run.get("pair")]


def product_over_stock(runs: list[dict], rows: int = 10**6) -> dict[str, dict]:
    """Per runner at `rows`: product / stock wall time, pair by pair, their geometric mean and 95% interval."""
    from testkit.stats import TooFewError, ratio_interval

    out = {}
    for runner in RUNNERS:
        sides = {
            side: {
                r.get("pair", 0): r["wall_s"]
                for r in runs
                if (r["side"], r["runner"], r["rows"]) == (side, runner, rows)
            }  # fmt: skip
            for side in SIDES
        }
        pairs = sorted(set(sides["product"]) & set(sides["stock"]))
        if not pairs:
            continue
        ratios = [sides["product"][i] / sides["stock"][i] for i in pairs]
        try:
            gmean, low, high = ratio_interval(ratios)
            interval = [round(low, 3), round(high, 3)]
        except TooFewError:
            gmean, interval = ratios[0], None
        out[runner] = {"pairs": len(ratios), "gmean": round(gmean, 3), "ci95": interval}
    return out


def summarize(runs: list[dict]) -> dict:
    """The headline from the run lines (`side`, `runner`, `rows`, `wall_s`, `peak_rss_mb`)."""
    by_config: dict[str, dict[int, dict]] = {}
    for run in _first_runs(runs):
        by_config.setdefault(f"{run['side']}/{run['runner']}", {})[run["rows"]] = run
    exponents, memory = {}, {}
    for config, sizes in sorted(by_config.items()):
        rows = sorted(sizes)
        if len(rows) >= 2:
            exponents[config] = round(slope(rows, [sizes[r]["wall_s"] for r in rows]), 3)
        if 10**6 in sizes and 10**5 in sizes:
            memory[config] = round(sizes[10**6]["peak_rss_mb"] / sizes[10**5]["peak_rss_mb"], 3)
    totals = {runner: ratio["gmean"] for runner, ratio in product_over_stock(runs).items()}
    return {
        "exponents": exponents,
        "peak_memory_ratio_1e6_over_1e5": memory,
        "total_ratio_product_over_stock_1e6": totals,
    }


def marginal_exponents(runs: list[dict]) -> dict[str, float]:
    """Per configuration, the slope between its two largest sizes: the growth once the
    fixed start-up cost (a process, TensorFlow, TFX, one Beam pipeline per stage) is small
    beside the rows' cost, which the fit over all sizes mixes in."""
    by_config: dict[str, dict[int, float]] = {}
    for run in _first_runs(runs):
        by_config.setdefault(f"{run['side']}/{run['runner']}", {})[run["rows"]] = run["wall_s"]
    out = {}
    for config, sizes in sorted(by_config.items()):
        if len(sizes) >= 2:
            small, large = sorted(sizes)[-2:]
            out[config] = round(slope([small, large], [sizes[small], sizes[large]]), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--rows", default=",".join(str(r) for r in ROWS))
    parser.add_argument("--prism-rows", default=",".join(str(r) for r in PRISM_ROWS))
    parser.add_argument("--pairs", type=int, default=3,
                        help="in-process product/stock pairs at the largest size (the sweep's runs are the first)")  # fmt: skip
    parser.add_argument("--work", default="")
    parser.add_argument("--shared-with", default=None,
                        help="what else ran on the cores (None: the machine was idle)")  # fmt: skip
    parser.add_argument("--no-results", action="store_true", help="print only")
    args = parser.parse_args()
    if args.child:
        child(json.loads(sys.stdin.read()))
        return

    from testkit import results

    lines: list[dict] = []

    def emit(line: dict) -> None:
        lines.append(line)
        print(json.dumps(line), flush=True)

    from testkit.stats import abba_order

    work = args.work or tempfile.mkdtemp(prefix="scale_")
    prism_rows = {int(r) for r in args.prism_rows.split(",") if r}
    runs = []

    def run_one(side: str, runner: str, rows: int, data_root: str, pair: int = 0) -> None:
        name = f"{side}_{runner}_{rows}" + (f"_pair{pair}" if pair else "")
        root = os.path.join(work, name)
        spec = {"side": side, "runner": runner, "rows": rows, "root": root,
                "data_root": data_root}  # fmt: skip
        measured = measure(spec, os.path.join(work, f"{name}.log"))
        run = {"rows": rows, "side": side, "runner": runner, **({"pair": pair} if pair else {}),
               **measured}  # fmt: skip
        runs.append(run)
        emit(run)

    sizes = [int(r) for r in args.rows.split(",") if r]
    for size_index, rows in enumerate(sizes):
        data_root = os.path.join(work, f"data_{rows}")
        os.makedirs(data_root, exist_ok=True)
        write_rows(os.path.join(data_root, "data.csv"), rows)
        configs = [(side, runner) for runner in RUNNERS[:2] for side in SIDES]
        if rows in prism_rows:
            configs.append(("product", "prism"))
        shift = size_index % len(configs)
        for side, runner in configs[shift:] + configs[:shift]:
            run_one(side, runner, rows, data_root)
    # The sweep ran pair 0; the rest alternate which side goes first.
    largest = max(sizes)
    for pair, order in list(enumerate(abba_order(args.pairs, "stock", "product")))[1:]:
        for side in order:
            run_one(side, "in_process", largest, os.path.join(work, f"data_{largest}"), pair)
    emit({"summary": True, "marginal_exponents": marginal_exponents(runs),
          "product_over_stock_pairs": product_over_stock(runs, largest),
          "targets": {"exponent": 1.1, "memory_ratio": 2.0, "product_over_stock": 1.0}})  # fmt: skip
    emit(summarize(runs))
    if not args.no_results:
        results.write("scale", lines, shared_with=args.shared_with, argv=sys.argv[1:])


if __name__ == "__main__":
    main()
