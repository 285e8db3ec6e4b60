"""inference_diff: accuracy and latency of the nnhal delegate vs TFLite's CPU, TFLite's format.

Like tensorflow/lite/tools/evaluation/tasks/inference_diff: each run draws random
inputs (N(0.5, 1/3) clipped to [0, 1], mapped onto the range the model expects:
nnhal.tool_inputs; or benchmark_model's --input_layer_value_range / _files), invokes
the reference (TFLite CPU, one thread; CUSTOM ops TFLite has no kernel for on nnhal's
reference backend: nnhal.reference) and the test interpreter (TFLite + delegate)
``INVOKES_PER_RUN`` times each, and records per output the mean absolute difference.
Prints TFLite's lines, then per output the largest absolute difference seen and that
difference relative to the reference output's range:

    Num evaluation runs: 50
    Reference run latency: avg=1234.5(us), std_dev=12.3(us)
    Test run latency: avg=...(us), std_dev=...(us)
    OutputDiff[0]: avg_error=1.2e-07, std_dev=3e-08
    OutputMaxError[0]: max_abs_error=4.8e-07, relative_error=2.4e-07
    Delegation: ...
    Input 0 range [0, 255] (from metadata Stats)

The last lines say where each input's values came from (the flags, the model's metadata, its
quantization, the default): a model fed values it does not expect compares the wrong thing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from delegate.report import allocation_error, memory_error
from nnhal.reference import reference_interpreter
from nnhal.tool_inputs import (  # noqa: F401 - random_input: part of this module's API
    add_input_arguments,
    check_input_flags,
    input_layers,
    input_sources,
    random_input,
    resize_inputs,
)

INVOKES_PER_RUN = 3


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def model_file_error(path: str) -> str | None:
    """Why the .tflite file cannot be handed to TFLite, or None. TFLite's loader does not verify
    the flatbuffer: a truncated or corrupted file would crash it (SIGSEGV) instead of failing; a
    tensor larger than the machine's memory fails its allocation (or draws the OOM killer)."""
    from delegate.tfl.reader import ModelFormatError, verify_model_file
    try:
        verify_model_file(path)
    except ModelFormatError as e:
        return one_line(e)
    return memory_error(path)


def model_and_inputs_error(args) -> str | None:
    """The model file and the input flags (--input_layer...) of a tool run, checked before it runs."""
    import os
    if not os.path.isfile(args.model_file):
        return f"cannot read model file {args.model_file!r}"
    error = model_file_error(args.model_file)
    if error:
        return f"{args.model_file}: {error}"
    try:
        sources = check_input_flags(args.model_file, input_layers(args))
    except ValueError as e:
        return str(e)
    error = memory_error(args.model_file, {s.index: s.shape for s in sources}) if sources else None
    return f"{args.model_file}: {error}" if error else None  # an input --input_layer_shape made too large


def _interpreter(path: str, threads: int, delegates=None, reference_kernels: bool = False, sources=None):
    from delegate.runtime import Interpreter, OpResolverType
    kind = OpResolverType.BUILTIN_REF if reference_kernels else OpResolverType.AUTO
    it = Interpreter(model_path=path, num_threads=threads, experimental_delegates=delegates,
                     experimental_op_resolver_type=kind)
    if sources:
        resize_inputs(it, sources)
    it.allocate_tensors()
    return it


def _timed_invokes(it, inputs) -> tuple[list[float], list[np.ndarray]]:
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    times = []
    for _ in range(INVOKES_PER_RUN):
        t = time.perf_counter_ns()
        it.invoke()
        times.append((time.perf_counter_ns() - t) / 1e3)
    return times, [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _stats(xs: list[float]) -> tuple[float, float]:
    return (statistics.fmean(xs), statistics.pstdev(xs)) if xs else (0.0, 0.0)


class _OutputError:
    """One output's differences over the runs: TFLite's per-run mean, and the largest one."""

    def __init__(self):
        self.means: list[float] = []
        self.max_abs = 0.0
        self.ref_min, self.ref_max = np.inf, -np.inf

    def add(self, test: np.ndarray, ref: np.ndarray) -> None:
        ref64 = ref.astype(np.float64)
        diff = np.abs(test.astype(np.float64) - ref64)
        self.means.append(float(np.mean(diff)))
        if diff.size:
            self.max_abs = max(self.max_abs, float(diff.max()))
            self.ref_min, self.ref_max = min(self.ref_min, float(ref64.min())), max(self.ref_max, float(ref64.max()))

    def metrics(self) -> dict:
        span = self.ref_max - self.ref_min if self.ref_max > self.ref_min else 0.0
        relative = self.max_abs / span if span else (0.0 if self.max_abs == 0 else float("inf"))
        avg, std = _stats(self.means)
        return {"avg_error": avg, "std_dev": std, "max_abs_error": self.max_abs, "relative_error": relative}


def evaluate(model_file: str, num_runs: int = 50, threads: int = 1, delegate: str = "nnhal",
             service_address: str | None = None, reference_kernels: bool = False, seed: int = 0,
             progress: bool = False, options: dict | None = None, layers: dict | None = None,
             dump_dir: str | None = None) -> dict:
    """Run the evaluation; returns the metrics (also what --output_file_path writes). ``options``:
    more load_delegate options (TLS files, execution_preference, priority); ``layers``:
    nnhal.tool_inputs.input_layers (shapes, value ranges, files) by input name; ``progress``: a bar
    on a terminal; ``dump_dir``: per-operation outputs of the first run (nnhal.dump)."""
    from delegate.runtime import Interpreter
    from nnhal.tool_support import progress_bar, tflite_call
    delegates, report = None, None
    if delegate == "nnhal":
        from delegate import load_delegate
        d = load_delegate(service_address, **(options or {}))
        delegates = [d]
    elif delegate not in ("", "none"):
        raise ValueError(f"unknown delegate {delegate!r} (use 'nnhal' or 'none')")
    with tflite_call():
        details = Interpreter(model_path=model_file).get_input_details()
    sources = input_sources(details, layers or {}, model_file)  # a bad flag: ValueError before any run
    with tflite_call():  # TFLite's kernels; nnhal's reference backend for custom ops TFLite has none for
        reference = reference_interpreter(model_file, lambda oracle: _interpreter(
            model_file, 1, oracle, reference_kernels, sources))
        ref = reference.interpreter
        test = _interpreter(model_file, threads, delegates, reference_kernels, sources)
    if delegates:
        report = delegates[0].report
    rng = np.random.default_rng(seed)
    ref_lat, test_lat, dump = [], [], None
    errors = [_OutputError() for _ in ref.get_output_details()]
    for run in progress_bar(range(num_runs), desc="inference_diff", enabled=progress):
        inputs = [s.value(rng) for s in sources]
        if run == 0 and dump_dir:
            from nnhal.dump import dump_operations
            with tflite_call():
                index = dump_operations(dump_dir, model_file, inputs, sources, service_address, options,
                                        reference_kernels)
            dump = {"dir": dump_dir, "operations": len(index["operations"]),
                    "largest_difference": index["largest_difference"]}
        with tflite_call():
            t_ref, out_ref = _timed_invokes(ref, inputs)
            t_test, out_test = _timed_invokes(test, inputs)
        ref_lat += t_ref
        test_lat += t_test
        for e, a, b in zip(errors, out_test, out_ref):
            e.add(a, b)
    metrics = {
        "num_runs": num_runs,
        "reference_latency_us": dict(zip(("avg", "std_dev"), _stats(ref_lat))),
        "test_latency_us": dict(zip(("avg", "std_dev"), _stats(test_lat))),
        "output_errors": [e.metrics() for e in errors],
        "input_ranges": {s.name: ("file" if s.data is not None else s.value_range) for s in sources},
        "inputs": [{"name": s.name, "range": s.drawn_range(), "source": s.range_source} for s in sources],
    }
    if dump is not None:
        metrics["dump"] = dump
    if reference.oracle is not None:
        metrics["reference"] = {"oracle_nodes": reference.oracle_nodes, "oracle_custom_ops": reference.oracle_codes}
    if report is not None:
        metrics["delegation"] = {"delegated_nodes": report.delegated, "total_nodes": len(report.nodes),
                                 "partitions": len(report.partitions), "service": report.service,
                                 "error": report.error}
    return metrics


def format_metrics(m: dict) -> str:
    lines = [f"Num evaluation runs: {m['num_runs']}",
             f"Reference run latency: avg={m['reference_latency_us']['avg']:.1f}(us), "
             f"std_dev={m['reference_latency_us']['std_dev']:.1f}(us)",
             f"Test run latency: avg={m['test_latency_us']['avg']:.1f}(us), "
             f"std_dev={m['test_latency_us']['std_dev']:.1f}(us)"]
    for k, e in enumerate(m["output_errors"]):
        lines.append(f"OutputDiff[{k}]: avg_error={e['avg_error']:.6g}, std_dev={e['std_dev']:.6g}")
    for k, e in enumerate(m["output_errors"]):  # ours, after TFLite's lines
        lines.append(f"OutputMaxError[{k}]: max_abs_error={e['max_abs_error']:.6g}, "
                     f"relative_error={e['relative_error']:.6g}")
    oracle = m.get("reference")
    if oracle is not None:
        lines.append(f"Reference: TFLite's kernels, and nnhal's reference backend for node(s) "
                     f"{','.join(map(str, oracle['oracle_nodes']))} (custom ops TFLite has no kernel for: "
                     f"{', '.join(oracle['oracle_custom_ops'])})")
    d = m.get("delegation")
    if d is not None:
        lines.append(f"Delegation: {d['delegated_nodes']}/{d['total_nodes']} nodes in {d['partitions']} "
                     f"partition(s) on nnhal" + (f" ({d['error']})" if d["error"] else ""))
    dump = m.get("dump")
    if dump is not None:
        big = dump["largest_difference"]
        where = (f"largest max_abs_diff {big['max_abs_diff']:.6g} at partition {big['partition']} operation "
                 f"{big['operation']} ({big['type']})") if big else "no difference"
        lines.append(f"Dump: {dump['operations']} operations in {dump['dir']} (index.json; {where})")
    lines += [input_line(k, i) for k, i in enumerate(m.get("inputs", []))]  # last: where the inputs came from
    return "\n".join(lines)


def input_line(k: int, i: dict) -> str:
    """``Input 0 range [0, 255] (from metadata Stats)``: where input k's values came from."""
    if i["range"] is None:
        if i["source"] == "--input_layer_value_files":
            return f"Input {k} values from its file ({i['source']})"
        return f"Input {k} random booleans (from {i['source']})"
    return f"Input {k} range [{i['range'][0]:g}, {i['range'][1]:g}] (from {i['source']})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model_file", required=True)
    from nnhal.tool_support import add_bool_flag, add_delegate_arguments
    p.add_argument("--num_runs", type=int, default=50, help="evaluation runs (>= 1)")
    p.add_argument("--num_interpreter_threads", type=int, default=1, help="the test interpreter's threads (>= 1)")
    p.add_argument("--output_file_path", default=None, help="write the metrics as JSON here")
    p.add_argument("--delegate", default="nnhal", help="'nnhal' (default) or 'none'")
    add_input_arguments(p)
    add_delegate_arguments(p)
    p.add_argument("--dump-dir", default=None, help="write each delegated operation's output of the first run "
                   "and TFLite CPU's value of the same tensor (.npy) and index.json: where outputs start to differ")
    add_bool_flag(p, "--reference-kernels", help="use TFLite's reference kernels on both sides (the bit-exactness "
                  "oracle)")


def _usage_error(args: argparse.Namespace) -> str | None:
    """A bad flag value or file, found before anything runs (the output file too: not after the run)."""
    import os

    from nnhal.tool_support import check_output_file
    if args.num_runs < 1:
        return "--num_runs must be >= 1"
    if args.num_interpreter_threads < 1:
        return "--num_interpreter_threads must be >= 1"
    if args.delegate not in ("nnhal", "none", ""):
        return f"unknown --delegate {args.delegate!r} (use 'nnhal' or 'none')"
    error = check_output_file(args.output_file_path)
    if error:
        return f"--output_file_path: {error}"
    if args.dump_dir and args.delegate not in ("nnhal",):
        return "--dump-dir needs --delegate nnhal (it dumps the delegated operations)"
    if args.dump_dir and os.path.exists(args.dump_dir) and not os.path.isdir(args.dump_dir):
        return f"--dump-dir: {args.dump_dir} is not a directory"
    return model_and_inputs_error(args)


def tool_error(e: BaseException, model_file: str) -> str:
    """A TFLite error in one line; one without a message (LiteRT's failed allocation) says which
    tensor is the largest and the memory there is."""
    from nnhal.tool_support import tflite_error
    return tflite_error(e, model_file) if str(e).strip() else allocation_error(model_file, e)


def run_cli(args: argparse.Namespace) -> int:
    from nnhal.tool_support import delegate_options, interrupted, interrupts_after_tflite_calls
    error = _usage_error(args)
    if error:
        print(f"inference_diff: {error}", file=sys.stderr)
        return 2
    try:
        options = delegate_options(args) if args.delegate == "nnhal" else {}
    except ValueError as e:
        print(f"inference_diff: {e}", file=sys.stderr)
        return 2
    try:
        with interrupts_after_tflite_calls("inference_diff"):
            m = evaluate(args.model_file, args.num_runs, args.num_interpreter_threads, args.delegate,
                         args.service_address, args.reference_kernels, options=options, layers=input_layers(args),
                         progress=True, dump_dir=args.dump_dir)
    except KeyboardInterrupt:
        return interrupted("inference_diff")
    except MemoryError as e:  # tflite_runtime's std::bad_alloc, numpy's "Unable to allocate"
        print(f"inference_diff: {args.model_file}: {allocation_error(args.model_file, e)}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as e:  # TFLite's load / prepare errors: multi-line, joined
        print(f"inference_diff: {args.model_file}: {tool_error(e, args.model_file)}", file=sys.stderr)
        return 2
    except OSError as e:  # --dump-dir: not creatable, disk full
        print(f"inference_diff: --dump-dir: {e.strerror or e}: {e.filename or args.dump_dir}", file=sys.stderr)
        return 2
    print(format_metrics(m))
    if args.output_file_path:
        try:
            with open(args.output_file_path, "w") as f:
                json.dump(m, f, indent=1)
        except OSError as e:  # checked before the run; the disk can still fill up
            print(f"inference_diff: cannot write {args.output_file_path}: {e.strerror or e}", file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    from nnhal.tool_support import OneLineErrors, unconsumed_flags
    from service.logconfig import add_log_level_argument, configure_logging
    p = OneLineErrors(prog="inference_diff", description=__doc__.splitlines()[0], allow_abbrev=False)
    add_arguments(p)
    add_log_level_argument(p)
    args, extras = p.parse_known_args(argv)
    try:
        configure_logging(args.log_level)
    except ValueError as e:
        print(f"inference_diff: {e}", file=sys.stderr)
        return 2
    return unconsumed_flags("inference_diff", extras) or run_cli(args)


if __name__ == "__main__":
    sys.exit(main())
