"""`nnhal cts` (parser in nnhal.cli): run the conformance corpus and print the per-operation table."""
from __future__ import annotations

import argparse
import json
import sys

from nnhal.cts.corpus import DEFAULT_CORPUS, load_cases
from nnhal.cts.runner import InProcessTarget, Outcome, ServiceTarget, run

#: Outcomes that make the command fail: a driver defect, never a missing feature.
FAILING = (Outcome.WRONG, Outcome.REJECTED, Outcome.CRASH)


def main(args: argparse.Namespace) -> int:
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
        target = InProcessTarget() if args.service is None else ServiceTarget(args.service or None, tls=tls)
    except (ValueError, ServiceUnavailableError) as e:
        print(f"nnhal cts: {e}", file=sys.stderr)
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
