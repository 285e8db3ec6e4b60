"""What nnhal's commands share: one flag spelling rule and one-line usage errors (OneLineErrors);
for the TFLite-style tools (report, benchmark, inference_diff), the flags that reach the service
(address, TLS) and the delegate's options, checked before any run; the output file, checked before
the run too; and Ctrl-C that ends a run with one line, even inside TFLite.

Flag spelling, the same in every command: a name TFLite gives (TFLITE_FLAGS: its tools' flags and
its NNAPI delegate's option names) keeps TFLite's underscores, so a TFLite command line works as
is; every other flag is nnhal's own and spelled with dashes (--tls-ca-file, --service-address,
--log-level). Every flag also accepts the other separator (--num-runs, --tls_ca_file), unlisted,
so no command line written for an earlier spelling breaks."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading

#: Exit status after Ctrl-C, as shells report a process ended by SIGINT.
INTERRUPTED = 130


#: Flag names TFLite gives, spelled as TFLite spells them: benchmark_model's and inference_diff's
#: flags, its NNAPI delegate provider's (--nnapi_*, --delegate_serialize_*), and the options of
#: StatefulNnApiDelegate that nnhal's tools take as flags.
TFLITE_FLAGS = frozenset("--" + name for name in (
    "graph", "num_runs", "warmup_runs", "min_secs", "max_secs", "num_threads", "enable_op_profiling",
    "report_peak_memory_footprint", "input_layer", "input_layer_shape", "input_layer_value_range",
    "input_layer_value_files",  # benchmark_model
    "model_file", "num_interpreter_threads", "output_file_path", "delegate",  # inference_diff
    "nnapi_execution_preference", "nnapi_execution_priority", "nnapi_accelerator_name", "nnapi_allow_fp16",
    "disable_nnapi_cpu", "max_delegated_partitions", "min_nodes_per_partition", "delegate_serialize_dir",
    "delegate_serialize_token",  # the NNAPI delegate provider
    "execution_preference", "accelerator_name", "allow_fp16", "disallow_nnapi_cpu",
    "max_number_delegated_partitions", "model_token", "cache_dir",  # StatefulNnApiDelegate::Options
))


def other_separators(flag: str) -> set[str]:
    """The spellings of ``flag`` with the other word separator: --num_runs -> {--num-runs}."""
    if not flag.startswith("--"):
        return set()
    name = flag[2:]
    return {"--" + name.replace("_", "-"), "--" + name.replace("-", "_")} - {flag}


class OneLineErrors(argparse.ArgumentParser):
    """The parser of every nnhal command: argparse's usage errors in one line ("nnhal benchmark:
    argument --num_runs: invalid int value: 'x'"), like every other bad input of the command line;
    and every flag also under its other separator (see the module's docstring), unlisted: help and
    error messages name the canonical spelling only."""

    def error(self, message: str):
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)

    def parse_known_args(self, args=None, namespace=None):
        # Here rather than in add_argument: argument groups add actions without it. Each
        # subcommand's parser runs this too, when the subcommand is chosen.
        for action in self._actions:
            for flag in action.option_strings:
                for alias in other_separators(flag):
                    self._option_string_actions.setdefault(alias, action)
        return super().parse_known_args(args, namespace)

    def _get_option_tuples(self, option_string):
        """An abbreviation (serve's --no for --no-cache) that matches two spellings of one flag is
        not ambiguous: one match per flag (argparse's private hook for abbreviations)."""
        seen: set[int] = set()
        return [t for t in super()._get_option_tuples(option_string)
                if not (id(t[0]) in seen or seen.add(id(t[0])))]


def hidden_alias(p: argparse.ArgumentParser, action: argparse.Action, *names: str) -> None:
    """Old names of ``action`` that keep working, exactly as spelled (not under the other
    separator), and stay out of the help: --cache_dir, now --delegate_serialize_dir, must not make
    the service's --cache-dir spelling mean the delegate's key on a tool."""
    for name in names:
        if name in p._option_string_actions:
            raise ValueError(f"{name} is already a flag of {p.prog}")
        p._option_string_actions[name] = action


#: Exit status for flags a tool does not know (TFLite's tools: EXIT_FAILURE).
UNCONSUMED_FLAGS = 1


def unconsumed_flags(prog: str, extras: list[str]) -> int | None:
    """TFLite's tools list the flags they did not consume ("Unconsumed cmdline flags: --foo") and
    go on; here that line ends the run, since a misspelt flag would silently change what is
    measured."""
    if not extras:
        return None
    print(f"{prog}: Unconsumed cmdline flags: {' '.join(extras)}", file=sys.stderr)
    return UNCONSUMED_FLAGS


def flag_bool(text: str) -> bool:
    """TFLite's bool flags: --flag, --flag=true|false|1|0."""
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true, false, 1 or 0, not {text!r}")


def add_bool_flag(p: argparse.ArgumentParser, *names: str, help: str) -> None:  # noqa: A002 - argparse's name
    p.add_argument(*names, type=flag_bool, nargs="?", const=True, default=False, metavar="true|false", help=help)


def add_delegate_arguments(p: argparse.ArgumentParser) -> None:
    """The delegate's flags, the same in every tool: ours (dashes), and the names TFLite's tools give
    the NNAPI delegate's options (--nnapi_*, --disable_nnapi_cpu, --delegate_serialize_*)."""
    from delegate.partition import PARTITIONING
    p.add_argument("--service-address", metavar="ADDRESS", default=None,
                   help="the service: HOST:PORT (TCP; TLS with --tls-ca-file), or unix:PATH or a path with a / "
                        "(its unix socket); several services: a comma-separated list of those, or "
                        "dns:///HOST:PORT (docs/deploy.md); default: the per-user socket, else an embedded service")
    p.add_argument("--tls-ca-file", metavar="PEM", default=None, help="TLS to a HOST:PORT service: the CA to trust")
    p.add_argument("--tls-cert-file", metavar="PEM", default=None,
                   help="client certificate, for a service that requires one (nnhal serve --tls-client-ca)")
    p.add_argument("--tls-key-file", metavar="PEM", default=None, help="the client certificate's private key")
    p.add_argument("--execution_preference", "--nnapi_execution_preference", dest="execution_preference",
                   default="fast_single_answer", help="low_power, fast_single_answer (default) or sustained_speed")
    p.add_argument("--priority", "--nnapi_execution_priority", dest="priority", default="medium",
                   help="low, medium (default) or high")
    p.add_argument("--accelerator_name", "--nnapi_accelerator_name", dest="accelerator_name", default=None,
                   help="the device to use: nnhal (the only one)")
    add_bool_flag(p, "--allow_fp16", "--nnapi_allow_fp16", help="let float32 operations run in float16")
    add_bool_flag(p, "--disable_nnapi_cpu", "--disallow_nnapi_cpu", help="a service failing during invoke fails "
                  "the invoke instead of running the partition in-process")
    p.add_argument("--max_delegated_partitions", type=int, default=None,
                   help="partitions kept, the first in --partitioning's order (default 3; 0 = unlimited)")
    p.add_argument("--max_number_delegated_partitions", type=int, default=None,
                   help="the same as TFLite's NNAPI delegate counts it: <= 0 = unlimited")
    p.add_argument("--min_nodes_per_partition", type=int, default=1)
    p.add_argument("--partitions", default=None, help='manual node ranges, e.g. "0-11,177-215"')
    p.add_argument("--partitioning", choices=PARTITIONING, default="cost",
                   help="cost (default): a wholly supported model runs whole on the service; a partly "
                        "supported one only in the partitions estimated faster there than on the CPU "
                        "(the service's capabilities); cost_strict: that rule for a whole model too; "
                        "largest: the largest partitions (TFLite NNAPI delegate's rule)")
    serialize_dir = p.add_argument(
        "--delegate_serialize_dir", dest="cache_dir", metavar="DIR", default=None,
        help="the delegate's cache_dir: an existing directory whose real path is mixed into the cache token, "
             "so runs with different directories never share compiled entries; a key, not storage (the "
             "compiled entries stay in the service's cache, nnhal serve --cache-dir); was --cache_dir")
    hidden_alias(p, serialize_dir, "--cache_dir")
    token = p.add_argument("--model_token", "--delegate_serialize_token", dest="cache_token", metavar="TOKEN",
                           default=None,
                           help="mixed into the cache token; keep it stable to share compiled entries across runs")
    hidden_alias(p, token, "--cache_token")


#: The tools' TLS flags, as their messages name them.
TLS_FLAGS = ("--tls-ca-file", "--tls-cert-file", "--tls-key-file")


def delegate_options(args: argparse.Namespace) -> dict:
    """load_delegate's options (without service_address) from the flags, checked now: a missing
    TLS file or an unknown preference is a ValueError (one line, naming the flag) before TFLite
    loads anything."""
    from delegate.nnhal_delegate import NnhalOptions
    from service.tls import check_tls_address, client_tls
    if client_tls(args.tls_ca_file, args.tls_cert_file, args.tls_key_file, TLS_FLAGS) is not None:
        check_tls_address(args.service_address, "/".join(TLS_FLAGS))
    if args.cache_dir is not None and not os.path.isdir(args.cache_dir):
        raise ValueError(f"--delegate_serialize_dir {args.cache_dir!r} is not a directory (it must exist, "
                         f"as in TFLite)")
    options = {name: getattr(args, name) for name in (
        "tls_ca_file", "tls_cert_file", "tls_key_file", "execution_preference", "priority", "accelerator_name",
        "allow_fp16", "min_nodes_per_partition", "partitions", "partitioning", "cache_dir")}
    options["allow_in_process_fallback"] = not args.disable_nnapi_cpu
    for name in ("max_delegated_partitions", "max_number_delegated_partitions", "cache_token"):
        if getattr(args, name) is not None:  # given: both partition flags at once is refused
            options[name] = getattr(args, name)
    NnhalOptions.from_kwargs(service_address=args.service_address, **options)
    return options


def progress_bar(iterable=None, total: int | None = None, desc: str | None = None, enabled: bool = True,
                 unit: str = "run"):
    """A tqdm bar on stderr for work that can take seconds, shown only when stderr is a terminal and
    ``enabled`` (callers pass ``not args.json``): piped output and JSON stay clean. The bar is
    erased when done, so the tool's own output reads the same with and without it."""
    from tqdm import tqdm
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=not (enabled and sys.stderr.isatty()))


def check_output_file(path: str | None) -> str | None:
    """Why ``path`` cannot be written, or None: checked before a run, not after it."""
    if not path:
        return None
    if os.path.isdir(path):
        return f"{path} is a directory"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"no such directory: {folder}"
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{path} is not writable"
    return None


class _Deferral:
    depth = 0  # TFLite calls in progress on the main thread
    pending = False  # Ctrl-C came during one


_state = _Deferral()


@contextlib.contextmanager
def tflite_call():
    """Around a TFLite call that may run the delegate's callbacks (Interpreter(), allocate_tensors,
    invoke): a KeyboardInterrupt raised inside a ctypes callback is printed by ctypes as "Exception
    ignored", TFLite sees a failed node, and the interrupt is lost. So Ctrl-C is noted meanwhile and
    raised when the call returns (a second Ctrl-C stops at once). A no-op unless a tool installed
    the handler (interrupts_after_tflite_calls)."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        if _state.pending and _state.depth == 0:
            _state.pending = False
            raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_after_tflite_calls(prog: str):
    """Install the SIGINT handler tflite_call relies on, for one tool run (main thread only; a
    SIGINT the caller ignores stays ignored)."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def on_sigint(signum, frame):
        if _state.depth == 0:
            raise KeyboardInterrupt
        if _state.pending:  # the second Ctrl-C: the user does not want to wait for TFLite
            os.write(2, f"{_line_start()}{prog}: interrupted\n".encode())
            os._exit(INTERRUPTED)
        _state.pending = True

    old = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        _state.pending = False


def _line_start() -> str:
    """On a terminal, back to column 0 and clear the line: a Ctrl-C can land while a progress bar is
    being drawn (inside tqdm's constructor, before ``with`` could close it), leaving the bar on the
    line the message would otherwise continue."""
    try:
        return "\r\x1b[K" if sys.stderr.isatty() else ""
    except (AttributeError, ValueError):  # stderr replaced or closed
        return ""


def interrupted(prog: str) -> int:
    print(f"{_line_start()}{prog}: interrupted", file=sys.stderr)
    return INTERRUPTED


def tflite_error(e: BaseException, model_file: str) -> str:
    """TFLite's load / prepare error in one line: its error reporter often repeats the message (the
    repeat is dropped), and a custom op without a kernel gets which extension would provide it."""
    text = _drop_repeat(" ".join(str(e).split()) or type(e).__name__)
    if "unresolved custom op" in text:  # TFLite's link to its docs out, which extension has it in
        from delegate.report import custom_op_hints
        hint = custom_op_hints(model_file)
        text = text.split(" See instructions:")[0].rstrip(".") + (f" ({hint})" if hint else "")
    return text


def _drop_repeat(text: str) -> str:
    """"A.A." or "A. A." (+ anything) -> "A." (+ the same): the longest repeated start, 10+ chars."""
    for n in range(len(text) // 2, 9, -1):
        for rest in (text[n:], text[n + 1:] if text[n:n + 1] == " " else ""):
            if rest.startswith(text[:n]):
                return text[:n] + rest[n:]
    return text
