"""`nnhal` command line. Subcommands import their implementation lazily."""
from __future__ import annotations

import argparse
import os
import sys


def _cmd_ops(args: argparse.Namespace) -> int:
    from nnhal.ops_table import print_ops
    print_ops(as_json=args.json)
    return 0


def _cmd_backends(args: argparse.Namespace) -> int:
    import json

    from hal import backends, performance
    from hal.types import OperandType, operation_name
    try:
        order = backends.preference()
    except Exception as e:  # noqa: BLE001 - a bad $NNHAL_BACKENDS: say so
        print(f"nnhal backends: {getattr(e, 'message', e)}", file=sys.stderr)
        return 2
    rows = []
    for b in backends.available():
        runs = [{"operation": operation_name(spec.type), "operand_types": [OperandType(t).name for t in types
                                                                           if b.name in backends.runs(spec, t)]}
                for spec, types in backends.support_matrix()]
        rows.append({"name": b.name, "version": b.version, "identity": b.identity(), "priority": b.priority,
                     "enabled": b.name in order, "description": b.description,
                     "performance": {OperandType(t).name: v for t, v in performance.stated(b.name).items()},
                     "operations": [r for r in runs if r["operand_types"]]})
    times = performance.exec_times(order)
    if args.json:
        print(json.dumps({"preference": list(order), "backends": rows,
                          "exec_time": {OperandType(t).name: v for t, v in times.items()}}, indent=1))
        return 0
    for r in rows:
        n_types = sum(len(o["operand_types"]) for o in r["operations"])
        state = f"enabled, #{order.index(r['name']) + 1}" if r["enabled"] else "not enabled"
        print(f"{r['name']:<12} {r['identity']:<40} {state:<14} {len(r['operations'])} operations, "
              f"{n_types} (operation, type) combinations  {r['description']}")
    print(f"preference: {','.join(order)}  (set with nnhal serve --backend or $NNHAL_BACKENDS)")
    slowest = performance.slowest(times)
    stated = ", ".join(f"{OperandType(t).name} {v:g}" for t, v in times.items() if v != slowest)
    print(f"exec_time vs LiteRT 2.3's CPU, 1 thread (getCapabilities, measured; lower is faster): {stated}; "
          f"every other type {slowest:g}")
    return 0


def _allow_uids(specs: list[str] | None) -> set[int] | None:
    """--allow-uid UID[,UID...] (repeatable); None when not given (the service's own uid)."""
    if not specs:
        return None
    uids = set()
    for spec in specs:
        for part in spec.split(","):
            if not part.strip().isdigit():
                raise ValueError(f"--allow-uid takes user ids, UID[,UID...] (e.g. $(id -u alice)), not {spec!r}")
            uids.add(int(part))
    return uids


def _cmd_serve(args: argparse.Namespace) -> int:
    from service.server import default_cache_dir, serve  # logging: configured in main (--log-level, $NNHAL_LOG)
    if (args.tls_cert is None) != (args.tls_key is None):
        print("nnhal serve: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if args.listen is None and (args.tls_cert or args.insecure):
        print("nnhal serve: --tls-cert/--insecure only apply with --listen", file=sys.stderr)
        return 2
    if args.cache_max_bytes is not None and args.cache_max_bytes < 0:
        print(f"nnhal serve: --cache-max-bytes must be >= 0, not {args.cache_max_bytes}", file=sys.stderr)
        return 2
    if args.tls_client_ca and not args.tls_cert:
        print("nnhal serve: --tls-client-ca needs --tls-cert/--tls-key (the service's own certificate)",
              file=sys.stderr)
        return 2
    tls = None
    if args.tls_cert:
        from service.tls import server_tls
        try:
            tls = server_tls(args.tls_cert, args.tls_key, args.tls_client_ca)
        except ValueError as e:
            print(f"nnhal serve: {e}", file=sys.stderr)
            return 2
    from extensions.plugins import load_object, load_plugins
    for r in load_plugins():
        if r.error:
            print(f"nnhal serve: extension plugin {r.entry_point} skipped: {r.error}", file=sys.stderr)
    for spec in args.extension or ():
        try:
            load_object(spec)
        except Exception as e:  # noqa: BLE001 - report and go on serving builtins
            print(f"nnhal serve: --extension {spec} not loaded: {e!r}", file=sys.stderr)
    if args.threads < 0:
        print("nnhal serve: --threads must be >= 0", file=sys.stderr)
        return 2
    from hal import backends as hal_backends
    hal_backends.ensure_loaded()
    hal_backends.set_compute_threads(args.threads)
    cache_dir = None if args.no_cache else (args.cache_dir or default_cache_dir())
    try:
        if args.max_clients < 1 or args.client_max_bytes < 1:
            raise ValueError("--max-clients and --client-max-bytes must be >= 1")
        return serve(args.socket, args.listen, args.workers, tls, args.insecure, cache_dir, args.cache_max_bytes,
                     backends=args.backend, parent_pid=args.parent_pid, max_clients=args.max_clients,
                     client_max_bytes=args.client_max_bytes, relative_speed=args.relative_speed,
                     performance_file=args.performance, allow_uids=_allow_uids(args.allow_uid))
    except ValueError as e:
        print(f"nnhal serve: {e}", file=sys.stderr)
        return 2


def _cmd_cache(args: argparse.Namespace) -> int:
    from cache.files import CacheKeyError
    from cache.store import CacheError, CacheStore
    from service.driver import Driver, capabilities_fingerprint
    from service.server import default_cache_dir
    d = args.cache_dir or default_cache_dir()
    if args.cache_dir is None and not os.path.lexists(d):  # no service has run as this user yet
        print(f"0 entries: no compilation cache at {d} yet (nnhal serve makes it)")
        return 0
    try:  # inspects only: a missing directory or key is not made, a bad key not replaced (nnhal serve does)
        store = CacheStore(d, driver_version=Driver.version_string(),
                           capabilities_fingerprint=capabilities_fingerprint(), create=False)
    except CacheKeyError as e:
        print(f"nnhal cache: {e} (nnhal serve moves a bad key aside and makes a new one)", file=sys.stderr)
        return 2
    except CacheError as e:
        print(f"nnhal cache: {e}", file=sys.stderr)
        return 2
    try:
        return _CACHE_ACTIONS[args.action](store)
    except CacheError as e:  # clear on a read-only directory
        print(f"nnhal cache: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # verify removing a bad entry from a read-only directory, a folder gone meanwhile
        print(f"nnhal cache: {e.filename or store.dir}: {e.strerror or e}", file=sys.stderr)
        return 2


def _cache_ls(store) -> int:
    import time
    entries = store.entries()
    print(f"{'token':<64}  {'model B':>9}  {'data B':>11}  last used")
    for e in entries:
        print(f"{e.token_hex:<64}  {e.model_bytes:>9}  {e.data_bytes:>11}  "
              f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e.last_used))}")
    print(f"{len(entries)} entries, {store.total_bytes()} bytes in {store.dir}")
    return 0


def _cache_verify(store) -> int:
    entries = store.entries()
    if entries and store.key is None:
        print(f"nnhal cache: cache key {store.key_path} is missing: the {len(entries)} entries cannot be verified "
              f"(nnhal serve makes a new key, then recompiles them)", file=sys.stderr)
        return 2
    bad = 0
    for e in entries:
        reason = store.verify(bytes.fromhex(e.token_hex))
        print(f"{e.token_hex}  {'ok' if reason is None else 'REJECTED (removed): ' + reason}")
        bad += reason is not None
    return 1 if bad else 0


def _cache_clear(store) -> int:
    n, kept = store.clear()
    print(f"removed {n} files from {store.dir}")
    if kept:
        print(f"kept {len(kept)} files nnhal cannot identify as its own cache entries:")
        for name, why in kept:
            print(f"  {name}: {why}")
    return 0


_CACHE_ACTIONS = {"ls": _cache_ls, "verify": _cache_verify, "clear": _cache_clear}


def _load_report(args: argparse.Namespace, prog: str):
    """The delegate's report on args.model_file, or the exit status after saying what is wrong."""
    import os

    from delegate.report import delegation_report
    if not os.path.isfile(args.model_file):
        print(f"{prog}: no such file: {args.model_file}", file=sys.stderr)
        return 2
    from nnhal.inference_diff import model_file_error
    from nnhal.tool_support import delegate_options, interrupts_after_tflite_calls, tflite_call, tflite_error
    error = model_file_error(args.model_file)  # before TFLite, whose loader would crash on a bad file
    if error:
        print(f"{prog}: cannot load {args.model_file}: {error}", file=sys.stderr)
        return 2
    try:  # bad flag values and TLS files: before TFLite loads anything
        options = delegate_options(args)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        with interrupts_after_tflite_calls(prog), tflite_call():
            return delegation_report(args.model_file, args.service_address, **options)
    except (ValueError, RuntimeError) as e:
        print(f"{prog}: cannot load {args.model_file}: {tflite_error(e, args.model_file)}", file=sys.stderr)
        return 2


def _cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the service answers SERVING on gRPC health (a Kubernetes exec probe), 1 otherwise."""
    from service.address import client_address
    from service.fleet import probe_health
    from service.tls import client_tls
    try:
        tls = client_tls(args.tls_ca_file, args.tls_cert_file, args.tls_key_file,
                         ("--tls-ca-file", "--tls-cert-file", "--tls-key-file"))
        address = client_address(args.address)
    except ValueError as e:
        print(f"nnhal health: {e}", file=sys.stderr)
        return 2
    why = probe_health(address, args.timeout, args.tls_server_name, **(tls.connect_kwargs() if tls else {}))
    if why is not None:
        print(f"nnhal health: {address}: {why}", file=sys.stderr)
        return 1
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from delegate.report import format_report, report_json
    r = _load_report(args, "nnhal report")
    if isinstance(r, int):
        return r
    print(report_json(r) if args.json else format_report(r))
    if args.model_explorer:
        from nnhal.model_explorer import read_benchmark, write_overlays
        try:
            paths = write_overlays(args.model_explorer, args.model_file, r,
                                   read_benchmark(args.benchmark_json, args.model_file))
        except (OSError, ValueError) as e:
            print(f"nnhal report: --model-explorer: {e}", file=sys.stderr)
            return 2
        print("Model Explorer overlays: " + ", ".join(paths), file=sys.stderr)
    return 0


def _cmd_explore(args: argparse.Namespace) -> int:
    import importlib.util
    import os
    import tempfile

    from nnhal.model_explorer import INSTALL_HINT, explore, read_benchmark, write_overlays
    if importlib.util.find_spec("model_explorer") is None:  # before the delegate runs
        print(f"nnhal explore: {INSTALL_HINT}", file=sys.stderr)
        return 2
    r = _load_report(args, "nnhal explore")
    if isinstance(r, int):
        return r
    out = args.out_dir or tempfile.mkdtemp(prefix="nnhal-explore-")
    stem = os.path.splitext(os.path.basename(args.model_file))[0]
    try:
        os.makedirs(out, exist_ok=True)
        paths = write_overlays(os.path.join(out, stem), args.model_file, r,
                               read_benchmark(args.benchmark_json, args.model_file))
    except (OSError, ValueError) as e:
        print(f"nnhal explore: {e}", file=sys.stderr)
        return 2
    # Model Explorer shows the overlay added last: placement first on screen.
    return explore(args.model_file, sorted(paths, key=lambda p: p.endswith(".placement.json")), args.port,
                   not args.no_browser)


def _cmd_extensions(args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from extensions.plugins import load_plugins
    from extensions.registry import registered
    results = load_plugins()
    exts = registered()
    if args.json:
        print(json.dumps({
            "extensions": [{"name": e.name, "version": e.version,
                            "operand_types": [{"type": t.type, "name": t.name, "dtype": np.dtype(t.dtype).name,
                                               "is_tensor": t.is_tensor, "byte_size": np.dtype(t.dtype).itemsize}
                                              for t in e.operand_types],
                            "operations": [{"type": o.type, "name": o.name, "custom_codes": list(o.custom_codes)}
                                           for o in e.operations]} for e in exts],
            "failed": [{"entry_point": r.entry_point, "error": r.error} for r in results if r.error]}, indent=1))
        return 0
    for e in exts:
        print(f"{e.name} {e.version}")
        for t in e.operand_types:
            kind = np.dtype(t.dtype).name + (", tensor" if t.is_tensor else "")
            print(f"  operand type {t.type}: {t.name} ({kind})")
        for o in e.operations:
            codes = ", ".join(o.custom_codes) or "-"
            print(f"  operation {o.type}: {o.name}  (TFLite custom code: {codes})")
    for r in results:
        if r.error:
            print(f"FAILED {r.entry_point}: {r.error}")
    print(f"{len(exts)} extension(s) loaded")
    return 0


def _add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    from service.server import default_socket_path
    serve.add_argument("--socket", metavar="PATH", default=None,
                       help=f"unix socket to listen on (default {default_socket_path()}, mode 0600); its "
                            f"handshake socket PATH.peer goes next to it")
    serve.add_argument("--allow-uid", action="append", metavar="UID[,UID...]", default=None,
                       help="on the unix socket, the users who may use the service, checked by the kernel's "
                            "peer credentials (default: the service's own uid only; the list replaces it, so "
                            "name your own uid too to keep using it); naming others makes the socket directory "
                            "0711 and the sockets 0666")
    serve.add_argument("--listen", metavar="HOST:PORT", default=None,
                       help="listen on TCP instead; needs --tls-cert/--tls-key, or --insecure on loopback")
    serve.add_argument("--tls-cert", metavar="PEM", default=None)
    serve.add_argument("--tls-key", metavar="PEM", default=None)
    serve.add_argument("--tls-client-ca", metavar="PEM", default=None,
                       help="require client certificates signed by this CA (mTLS); with --tls-cert/--tls-key")
    serve.add_argument("--insecure", action="store_true", help="plaintext TCP (loopback addresses only)")
    serve.add_argument("--workers", type=int, default=2, help="execution worker threads (default 2)")
    serve.add_argument("--cache-dir", metavar="DIR", default=None,
                       help="the service's compilation cache: where compiled models are stored (default "
                            "$XDG_CACHE_HOME/nnhal or ~/.cache/nnhal; not the tools' --delegate_serialize_dir, a "
                            "key mixed into the cache token)")
    serve.add_argument("--cache-max-bytes", type=int, default=None, metavar="N",
                       help="evict least-recently-used cache entries beyond this size (N >= 0); an entry "
                            "larger than N is not stored")
    serve.add_argument("--no-cache", action="store_true", help="disable compilation caching")
    serve.add_argument("--extension", action="append", metavar="MODULE:ATTR",
                       help="also load this extension object (installed plugins load automatically)")
    serve.add_argument("--backend", metavar="NAMES", default=None,
                       help="compute backend preference, best first, e.g. numba,reference (default "
                            "$NNHAL_BACKENDS, else every available backend by priority; reference is "
                            "always the last resort); `nnhal backends` lists them")
    serve.add_argument("--threads", type=int, default=1, metavar="N",
                       help="threads each operation or partition may use (onnxruntime's intra-op threads, the "
                            "BLAS GEMMs of the numba and reference backends; default 1, as TFLite's default; "
                            "0 = every core)")
    from service.sessions import DEFAULT_CLIENT_MAX_BYTES, DEFAULT_MAX_CLIENTS
    serve.add_argument("--max-clients", type=int, default=DEFAULT_MAX_CLIENTS, metavar="N",
                       help="clients connected at once (default %(default)s); more are refused")
    serve.add_argument("--client-max-bytes", type=int, default=DEFAULT_CLIENT_MAX_BYTES, metavar="N",
                       help="memory one client's prepared models and buffers may hold, estimated "
                            "(default %(default)s); beyond it: RESOURCE_EXHAUSTED")
    serve.add_argument("--relative-speed", type=float, default=None, metavar="R",
                       help="the execution time the capabilities report for every operand type, relative "
                            "to LiteRT 2.3's CPU, 1 thread (NNAPI PerformanceInfo.exec_time; 0.5 = twice as "
                            "fast); default: what the backends measured (`nnhal backends`); the delegate's cost "
                            "partitioning weighs partitions with it")
    serve.add_argument("--performance", default=None, metavar="FILE",
                       help="the exec_time figures to state, measured on this machine (JSON: backend -> "
                            "operand type -> time relative to LiteRT 2.3's CPU; make bench writes "
                            "bench/performance.json); default: the figures built in (`nnhal backends`)")
    serve.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)  # embedded: die with it


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line. ``command``: the subcommand about to run, where known: the options of
    serve and of the two TFLite tools, whose modules (the service, the delegate, the runtime) take a
    good part of a second to import, are added only for it (argparse reads only the chosen
    subcommand's options); None adds every subcommand's."""
    from nnhal.tool_support import OneLineErrors
    p = OneLineErrors(prog="nnhal", description="NNAPI-style accelerator driver in Python")
    sub = p.add_subparsers(dest="command", required=True)
    ops = sub.add_parser("ops", help="print the supported (operation, operand type) matrix")
    ops.add_argument("--json", action="store_true", help="print as a JSON list")
    ops.set_defaults(func=_cmd_ops)

    serve = sub.add_parser("serve", help="run the driver service (gRPC)")
    if command in (None, "serve"):  # its options' defaults come from the service's modules
        _add_serve_arguments(serve)
        serve.set_defaults(func=_cmd_serve)

    hp = sub.add_parser("health", help="exit 0 when a service answers SERVING on gRPC health (Kubernetes exec probes)")
    hp.add_argument("address", help="HOST:PORT, unix:PATH or a socket path")
    hp.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the answer (default 2)")
    hp.add_argument("--tls-ca-file", metavar="PEM", default=None, help="TLS: the CA to trust")
    hp.add_argument("--tls-cert-file", metavar="PEM", default=None, help="client certificate (mTLS)")
    hp.add_argument("--tls-key-file", metavar="PEM", default=None, help="the client certificate's private key")
    hp.add_argument("--tls-server-name", metavar="NAME", default=None,
                    help="the name the service's certificate is checked against (default: the address's host)")
    hp.set_defaults(func=_cmd_health)

    bk = sub.add_parser("backends", help="list the compute backends, their identity and what each runs")
    bk.add_argument("--json", action="store_true")
    bk.set_defaults(func=_cmd_backends)

    cache = sub.add_parser("cache", help="inspect the compilation cache")
    cache.add_argument("action", choices=["ls", "verify", "clear"],
                       help="ls: list entries; verify: check every entry (bad ones are removed); clear: remove "
                            "the entries (other files in the folder are kept and listed)")
    cache.add_argument("--cache-dir", metavar="DIR", default=None,
                       help="the service's compilation cache directory, as given to nnhal serve (default as "
                            "for serve); it must exist: nothing is created")
    cache.set_defaults(func=_cmd_cache)

    # The TFLite-style tools: TFLite's flag names where TFLite has one (tool_support's spelling rule),
    # no abbreviations (TFLite has none), and a flag they do not know is "Unconsumed cmdline flags" (main).
    report = sub.add_parser("report", help="which nodes of a .tflite model the delegate runs, and why not",
                            allow_abbrev=False)
    report.add_argument("--model_file", "--graph", dest="model_file", required=True)
    from nnhal.tool_support import add_delegate_arguments
    if command in (None, "report"):  # the delegate's options: their choices come from its modules
        add_delegate_arguments(report)
    report.add_argument("--json", action="store_true")
    report.add_argument("--model-explorer", metavar="FILE", default=None,
                        help="also write Model Explorer overlays (node data): FILE.placement.json, "
                             "FILE.partition.json and, with --benchmark-json, FILE.latency.json")
    report.add_argument("--benchmark-json", metavar="FILE", default=None,
                        help="nnhal benchmark --json output for this model: per-node latency overlay")
    report.set_defaults(func=_cmd_report)

    explore = sub.add_parser("explore", help="open a .tflite model in Model Explorer with nnhal's overlays "
                             "(needs the optional ai-edge-model-explorer)")
    explore.add_argument("model_file", metavar="MODEL")
    if command in (None, "explore"):
        add_delegate_arguments(explore)
    explore.add_argument("--benchmark-json", metavar="FILE", default=None,
                         help="nnhal benchmark --json output for this model: adds a latency overlay")
    explore.add_argument("--out-dir", default=None, help="where the overlay files go (default: a temp folder)")
    explore.add_argument("--port", type=int, default=8080, help="Model Explorer's port (default 8080 or the next "
                         "free one)")
    explore.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    explore.set_defaults(func=_cmd_explore)

    diff = sub.add_parser("inference-diff", help="accuracy/latency of the delegate vs TFLite CPU (TFLite's format)",
                          allow_abbrev=False)
    if command in (None, "inference-diff"):
        from nnhal import inference_diff
        inference_diff.add_arguments(diff)
        diff.set_defaults(func=inference_diff.run_cli)

    bench = sub.add_parser("benchmark", help="latency with/without the delegate, prepare times, per-op profile",
                           allow_abbrev=False)
    if command in (None, "benchmark"):
        from nnhal import benchmark
        benchmark.add_arguments(bench)
        bench.set_defaults(func=benchmark.run_cli)

    ext = sub.add_parser("extensions", help="list the vendor extensions installed (entry points nnhal.extensions)")
    ext.add_argument("--json", action="store_true")
    ext.set_defaults(func=_cmd_extensions)

    cts = sub.add_parser("cts", help="run NNAPI's CTS cases (cts/) and print a table per operation")
    cts.add_argument("--service", nargs="?", const="", default=None, metavar="ADDRESS",
                     help="through a real service: ADDRESS (HOST:PORT, or unix:PATH or a path with a / for its "
                          "unix socket), or (no value) a private one started for the run")
    cts.add_argument("--tls-ca-file", metavar="PEM", help="TLS to a HOST:PORT --service: the CA to trust")
    cts.add_argument("--tls-cert-file", metavar="PEM", help="client certificate, for a service that requires one")
    cts.add_argument("--tls-key-file", metavar="PEM", help="the client certificate's private key")
    cts.add_argument("--op", action="append", metavar="OPERATION",
                     help="only cases testing this operation (NNAPI name, e.g. CONV_2D; repeatable)")
    cts.add_argument("--name", metavar="TEXT", help="only cases whose name contains TEXT")
    cts.add_argument("--backend", metavar="NAMES", default=None,
                     help="compute backend preference, best first (as nnhal serve --backend), in-process or for "
                          "the private --service; default $NNHAL_BACKENDS, else every available backend by priority")
    cts.add_argument("--corpus", help="corpus file (.jsonl.gz; default: the project's cts/ corpus)")
    cts.add_argument("--show", choices=["failures", "unsupported", "all"], default="failures",
                     help="which cases to list below the table (default: %(default)s)")
    cts.add_argument("--json", action="store_true", help="print the table and failures as JSON")
    cts.set_defaults(func=lambda a: __import__("nnhal.cts.cli", fromlist=["main"]).main(a))

    demo = sub.add_parser("demo", help="inference_diff + benchmark on bundled example models (make run)")
    demo.add_argument("--out-dir", default=None, help="where the example .tflite files are written")
    demo.add_argument("--runs", type=int, default=20)
    demo.set_defaults(func=lambda a: __import__("nnhal.demo", fromlist=["main"]).main(a.out_dir, a.runs))
    from service.logconfig import add_log_level_argument
    for command in sub.choices.values():  # every subcommand: one convention (service.logconfig)
        add_log_level_argument(command)
    return p


TFLITE_TOOLS = ("report", "inference-diff", "benchmark")


def main(argv: list[str] | None = None) -> int:
    import faulthandler
    import signal
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack, to stderr
    except (OSError, ValueError):  # stderr is not a file (main called with it captured): no dump then
        pass
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
    args, extras = parser.parse_known_args(argv)
    if extras:
        if args.command not in TFLITE_TOOLS:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        from nnhal.tool_support import unconsumed_flags
        return unconsumed_flags("inference_diff" if args.command == "inference-diff" else f"nnhal {args.command}",
                                extras)  # the name the tool's other errors use
    from service.logconfig import configure_logging
    prog = "inference_diff" if args.command == "inference-diff" else f"nnhal {args.command}"
    try:  # a service reports what it does by default; a tool only what went wrong
        configure_logging(args.log_level, default="info" if args.command == "serve" else "warning")
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (`nnhal ops | head`): stop quietly, as Unix tools do. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT, no traceback
        from nnhal.tool_support import interrupted
        return interrupted(f"nnhal {args.command}")


if __name__ == "__main__":
    sys.exit(main())
