"""The conformance runner: every CTS case through a driver target, judged as CTS judges it.

A case goes the way an NNAPI app's model goes: getSupportedOperations, prepareModel, then one
execution per example. Outcomes:

- ``pass``: every example within CTS's criteria (or, for a case CTS expects to fail, refused);
- ``unsupported``: the driver reports some operation unsupported (CTS skips the case);
- ``wrong``: executed, but an output is out of tolerance or has the wrong shape — or a model CTS
  says is invalid was executed;
- ``rejected``: claimed supported, then refused by validation, prepareModel or execute;
- ``crash``: anything but a driver error (an exception escaping hal, a dead service).

Targets: ``InProcessTarget`` calls hal directly; ``ServiceTarget`` goes through a real service
over gRPC (one it starts itself, or ``--service ADDRESS``) and restarts a service it owns that died.
"""
from __future__ import annotations

import enum
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from hal.compiler import compile_model
from hal.errors import HalError
from hal.executor import execute
from hal.model import Model
from hal.support import support_reasons
from nnhal.cts.corpus import Case, CorpusError, build_model, examples
from nnhal.cts.judge import judge


class Outcome(str, enum.Enum):
    PASS = "pass"
    UNSUPPORTED = "unsupported"
    WRONG = "wrong"
    REJECTED = "rejected"
    CRASH = "crash"


@dataclass(frozen=True)
class Result:
    case: Case
    outcome: Outcome
    detail: str = ""


class Refused(Exception):
    """The driver refused (validation, prepare or execute error): an NNAPI error status."""


class InProcessTarget:
    """hal called directly, as the service's driver calls it."""

    name = "in-process"

    def support(self, model: Model) -> list[str | None]:
        return _refusing(support_reasons, model)

    def prepare(self, model: Model):
        return _refusing(compile_model, model)

    def execute(self, prepared, model: Model, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return _refusing(execute, prepared, inputs)  # None: an omitted input, as a request's has_no_value

    def release(self, prepared) -> None:
        pass

    def close(self) -> None:
        pass


def _refusing(fn, *args):
    try:
        return fn(*args)
    except HalError as e:
        raise Refused(str(e)) from e



def _service_log_level() -> str:
    """A private service's level: $NNHAL_LOG, else errors only (its INFO lines would mix with the table)."""
    from service.logconfig import resolve_level
    try:
        return resolve_level(None, default="error")
    except ValueError:
        return "error"

class ServiceTarget:
    """A real nnhal service over gRPC: the address given, or a private one this target starts
    (and restarts after a crash, so one bad case does not fail the rest)."""

    def __init__(self, address: str | None = None, serve_args: Iterable[str] = (), tls=None):
        """``tls``: a service.tls.ClientTls for a TLS address."""
        from service.client import Client
        self._client_cls = Client
        self._tls = tls.connect_kwargs() if tls is not None else {}
        self._own = address is None
        self._serve_args = list(serve_args)
        self._proc: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None
        self.address = address or self._start()
        self.client = Client.connect(self.address, **self._tls)
        self.name = f"service ({self.address})"

    def _start(self) -> str:
        self._dir = tempfile.TemporaryDirectory(prefix="nnhal-cts-")
        sock = os.path.join(self._dir.name, "nnhal.sock")
        self._proc = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "--socket", sock, "--no-cache",
                                       "--log-level", _service_log_level(), *self._serve_args],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        address = "unix:" + sock
        deadline = time.monotonic() + 30
        from service.client import answers
        while not answers(address):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the conformance runner's nnhal service did not start")
            time.sleep(0.005)
        return address

    def _call(self, fn, *args):
        from service.client import ServiceError, ServiceUnavailableError
        try:
            return fn(*args)
        except ServiceUnavailableError:
            raise
        except ServiceError as e:
            raise Refused(str(e)) from e

    def support(self, model: Model) -> list[str | None]:
        return self._call(self.client.get_support_reasons, model)

    def prepare(self, model: Model):
        return self._call(self.client.prepare_model, model)

    def execute(self, prepared, model: Model, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return self._call(prepared.execute, inputs).outputs

    def release(self, prepared) -> None:
        try:
            prepared.release()
        except Exception:  # noqa: BLE001 - a release failing after a crash is reported by the crash
            pass

    def recover(self) -> None:
        """After a crash: restart the private service (a given address is left to its owner)."""
        if not self._own:
            return
        self.close()
        self.address = self._start()
        self.client = self._client_cls.connect(self.address)

    def close(self) -> None:
        self.client.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def run_case(target, case: Case) -> Result:
    """One case through ``target``, judged."""
    def refused(stage: str, e: Exception) -> Result:
        if case.expect_failure:
            return Result(case, Outcome.PASS, f"refused at {stage}, as CTS expects: {e}")
        return Result(case, Outcome.REJECTED, f"{stage}: {e}")

    try:
        model = build_model(case)
    except CorpusError as e:
        return Result(case, Outcome.CRASH, f"corpus: {e}")
    prepared = None
    stage = "getSupportedOperations"
    try:
        reasons = target.support(model)
        missing = [f"{case.operation_types[k]}: {r}" for k, r in enumerate(reasons) if r is not None]
        if missing:
            if case.expect_failure:  # the driver declines a model CTS says is invalid: refused
                return Result(case, Outcome.PASS, "refused as unsupported, as CTS expects: " + "; ".join(missing))
            return Result(case, Outcome.UNSUPPORTED, "; ".join(missing))
        stage = "prepareModel"
        prepared = target.prepare(model)
        stage = "execute"
        for n, ex in enumerate(examples(case)):
            outs = target.execute(prepared, model, list(ex.inputs))
            if case.expect_failure:
                return Result(case, Outcome.WRONG, "executed a model CTS expects to be refused")
            msg = judge(case, ex, outs)
            if msg:
                return Result(case, Outcome.WRONG, f"example {n}: {msg}")
        return Result(case, Outcome.PASS)
    except Refused as e:
        return refused(stage, e)
    except Exception as e:  # noqa: BLE001 - anything else is the driver (or the service) failing
        if hasattr(target, "recover"):
            target.recover()
        return Result(case, Outcome.CRASH, f"{stage}: {type(e).__name__}: {e}")
    finally:
        if prepared is not None:
            target.release(prepared)


@dataclass
class Table:
    """Outcomes per tested operation (a case counts under ``Case.operation``)."""

    rows: dict[str, Counter] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)

    def add(self, r: Result) -> None:
        self.results.append(r)
        self.rows.setdefault(r.case.operation, Counter())[r.outcome] += 1

    def totals(self) -> Counter:
        total: Counter = Counter()
        for c in self.rows.values():
            total.update(c)
        return total

    def format(self) -> str:
        cols = list(Outcome)
        width = max([len(k) for k in self.rows] + [9])
        lines = [f"{'operation':<{width}}  {'cases':>5}  " + "  ".join(f"{c.value:>11}" for c in cols)]
        for op in sorted(self.rows):
            c = self.rows[op]
            lines.append(f"{op:<{width}}  {sum(c.values()):>5}  " + "  ".join(f"{c[o]:>11}" for o in cols))
        t = self.totals()
        lines.append(f"{'TOTAL':<{width}}  {sum(t.values()):>5}  " + "  ".join(f"{t[o]:>11}" for o in cols))
        return "\n".join(lines)

    def as_json(self) -> dict:
        return {"operations": {op: {o.value: c[o] for o in Outcome} for op, c in sorted(self.rows.items())},
                "failures": [{"case": r.case.name, "outcome": r.outcome.value, "detail": r.detail}
                             for r in self.results if r.outcome in (Outcome.WRONG, Outcome.REJECTED, Outcome.CRASH)]}


def run(target, cases: Iterable[Case], progress: Callable[[Result], None] | None = None) -> Table:
    table = Table()
    for case in cases:
        r = run_case(target, case)
        table.add(r)
        if progress is not None:
            progress(r)
    return table
