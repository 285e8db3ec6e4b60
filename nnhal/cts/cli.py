"""`nnhal cts` (parser in nnhal.cli): run the conformance corpus and print the per-operation table."""
from __future__ import annotations

import argparse
import json
import sys

from nnhal.cts.corpus import DEFAULT_CORPUS, load_cases
from nnhal.cts.runner import InProcessTarget, Outcome, ServiceTarget, run

#: Outcomes that make the command fail: a driver defect, never a missing feature.
FAILING = (Outcome.WRONG, Outcome.REJECTED, Outcome.CRASH)


def _target(args: argparse.Namespace, tls):
    """In-process (``--backend``: this process's preference), a private service (``--backend``: its
    ``serve --backend``) or the service at ``--service ADDRESS`` (its own order: not ours to set)."""
    from hal import backends
    if args.backend is not None:
        backends.parse_preference(args.backend)  # unknown names: one error here, before anything starts
        if args.service:
            raise ValueError(f"--backend: the service at {args.service} runs its own order (nnhal serve --backend)")
    if args.service is None:
        target = InProcessTarget()
        if args.backend is not None:
            target.name = f"in-process ({','.join(backends.set_preference(args.backend))})"
        return target
    serve_args = () if args.backend is None else ("--backend", args.backend)
    return ServiceTarget(args.service or None, serve_args=serve_args, tls=tls)


def main(args: argparse.Namespace) -> int:
    from hal.errors import HalError
    from service.address import is_fleet
    from service.client import ServiceUnavailableError
    from service.tls import check_tls_address, client_tls
    corpus = args.corpus or DEFAULT_CORPUS
    try:
        with open(corpus, "rb"):
            pass
    except OSError as e:
        where = "" if args.corpus else " (the corpus ships with the source tree's cts/, not with the wheel)"
        print(f"nnhal cts: cannot read the corpus {corpus}: {e.strerror}{where}; give --corpus FILE",
              file=sys.stderr)
        return 2
    try:
        tls = client_tls(args.tls_ca_file, args.tls_cert_file, args.tls_key_file,
                         ("--tls-ca-file", "--tls-cert-file", "--tls-key-file"))
        if tls is not None:
            check_tls_address(args.service or None, "--tls-ca-file/--tls-cert-file/--tls-key-file")
        if args.service and is_fleet(args.service):  # each case's result must come from the one service named
            raise ValueError(f"--service {args.service}: CTS checks one service; give one of its addresses")
        target = _target(args, tls)
    except (ValueError, ServiceUnavailableError, HalError) as e:
        print(f"nnhal cts: {getattr(e, 'message', e)}", file=sys.stderr)
        return 2
    cases = list(load_cases(corpus, args.op, args.name))
    from nnhal.tool_support import progress_bar
    bar = progress_bar(total=len(cases), desc=target.name, enabled=not args.json, unit="case")
    try:
        table = run(target, cases, lambda r: bar.update(1))
    finally:
        bar.close()
        target.close()
    if args.json:
        print(json.dumps({"target": target.name, **table.as_json()}, indent=1))
    else:
        print(f"NNAPI CTS ({len(cases)} cases) on {target.name}")
        print(table.format())
        show = {"failures": FAILING, "unsupported": FAILING + (Outcome.UNSUPPORTED,), "all": tuple(Outcome)}[args.show]
        for r in table.results:
            if r.outcome in show:
                print(f"{r.outcome.value:<11} {r.case.name}: {r.detail}")
    return 1 if any(table.totals()[o] for o in FAILING) else 0
