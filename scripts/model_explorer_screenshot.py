"""Screenshot of a model in Model Explorer with nnhal's overlays (docs/model_explorer.png).

Not part of CI and installs nothing. Run it with a Python that has ai-edge-model-explorer and
playwright; a headless Chromium comes from the system (Debian: apt-get install chromium), since
`playwright install` downloads a browser build of its own. nnhal itself may live in another
Python (--nnhal_python, default: the project's .venv). For example:

    python -m venv /tmp/me-venv && /tmp/me-venv/bin/pip install ai-edge-model-explorer playwright
    /tmp/me-venv/bin/python scripts/model_explorer_screenshot.py --out docs/model_explorer.png

Without a MODEL it writes tests.delegate.models.head_model with an unsupported COS in the
middle: two partitions around a CPU node. Steps: `nnhal benchmark --json` (the per-operation
profile), `nnhal report --model_explorer`, Model Explorer's server on a free port, Chromium
on its page with the chosen overlay selected, a screenshot.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERLAYS = ("placement", "partition", "latency")
ADAPTER_ID = "builtin_tflite_flatbuffer"  # nnhal.model_explorer.ADAPTER_ID (not imported: another Python)


def missing(chromium: str | None) -> list[str]:
    out = [f"python module {m} (pip install {p})" for m, p in (("model_explorer", "ai-edge-model-explorer"),
                                                               ("playwright", "playwright"))
           if importlib.util.find_spec(m) is None]
    if not chromium:
        out.append("a Chromium binary (Debian: apt-get install chromium; or --chromium PATH)")
    return out


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r


def overlays(nnhal_python: str, model: str, work: str) -> dict[str, str]:
    bench = os.path.join(work, "benchmark.json")
    r = run([nnhal_python, "-m", "nnhal.cli", "benchmark", "--graph", model, "--json", "--num_runs", "20",
             "--min_secs", "0", "--enable_op_profiling"])
    with open(bench, "w") as f:
        f.write(r.stdout)
    run([nnhal_python, "-m", "nnhal.cli", "report", "--model_file", model, "--model_explorer",
         os.path.join(work, "overlay.json"), "--benchmark_json", bench])
    return {name: os.path.join(work, f"overlay.{name}.json") for name in OVERLAYS}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model: str, node_data: list[str], port: int) -> subprocess.Popen:
    code = ("import sys, model_explorer as me; c = me.config(); "
            f"c.add_model_from_path({model!r}, adapterId={ADAPTER_ID!r}); "
            f"[c.add_node_data_from_path(p) for p in {node_data!r}]; "
            f"me.visualize_from_config(c, host='127.0.0.1', port={port}, no_open_in_browser=True)")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def wait_healthy(port: int, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"Model Explorer's server exited: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/check_health", timeout=2) as r:
                if r.read() == b"model_explorer_ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("Model Explorer's server did not come up")


def screenshot(url: str, chromium: str, out: str, width: int, height: int, settle_s: float) -> None:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--use-gl=swiftshader",
                                                                    "--enable-unsafe-swiftshader"])
        page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
        page.goto(url, wait_until="networkidle")
        page.wait_for_selector("canvas", timeout=60_000)
        time.sleep(settle_s)  # the WebGL graph renders after the page is idle
        page.screenshot(path=out)
        browser.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help=".tflite model (default: a small partly-supported one)")
    p.add_argument("--overlay", choices=OVERLAYS, default="placement", help="the overlay shown (default placement)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "model_explorer.png"))
    p.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    default_py = os.path.join(ROOT, ".venv", "bin", "python")
    p.add_argument("--nnhal_python", default=default_py if os.path.exists(default_py) else sys.executable,
                   help="a Python with nnhal installed (default: the project's .venv)")
    p.add_argument("--size", default="1280x800", help="viewport WIDTHxHEIGHT")
    p.add_argument("--settle_s", type=float, default=5.0)
    args = p.parse_args(argv)
    lacking = missing(args.chromium)
    if lacking:
        print("model_explorer_screenshot: needs " + "; ".join(lacking), file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="nnhal-me-shot-")
    model = args.model
    if model is None:
        model = os.path.join(work, "head_cos.tflite")
        run([args.nnhal_python, "-c", "import numpy as np, sys; from tests.delegate.models import head_model; "
             "open(sys.argv[1], 'wb').write(head_model(np.float32, unsupported_middle=True))", model])
    model = os.path.abspath(model)
    files = overlays(args.nnhal_python, model, work)
    shown = files.pop(args.overlay)  # Model Explorer selects the overlay added last
    node_data = [f for f in files.values() if os.path.exists(f)] + [shown]
    port = free_port()
    server = serve(model, node_data, port)
    try:
        wait_healthy(port, server)
        import model_explorer
        c = model_explorer.config()
        c.add_model_from_path(model, adapterId=ADAPTER_ID)
        for f in node_data:
            c.add_node_data_from_path(f)
        url = f"http://127.0.0.1:{port}/?data={c.to_url_param_value()}"
        w, h = (int(v) for v in args.size.split("x"))
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        screenshot(url, args.chromium, args.out, w, h, args.settle_s)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(f"wrote {args.out} (overlays in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
