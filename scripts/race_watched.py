"""The app's default race (qwen-coder, HumanEval/0, greedy, 64 tokens), headless through the server's API and
watched in Chromium on the same machine, alternating in one server: each lane's tokens/s both ways, the winner and
the time from the click to the verdict (docs/BENCHMARKS.md, "The race watched in a browser"). First, from a fresh
server: when the page answers, when the first Step lands and when a second one does (README's app section); last,
the server's resident memory.
    .venv/bin/python scripts/race_watched.py ROUNDS
"""
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gradio_client import Client
from playwright.sync_api import sync_playwright

ROOT = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, ROOT)
from specviz.app.race import COMPARED  # noqa: E402
from specviz.prompts import load_prompts  # noqa: E402
from specviz.strategies import STAGED_LOOKUP  # noqa: E402

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
proc = subprocess.Popen([f"{ROOT}/.venv/bin/python", "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
url = f"http://127.0.0.1:{port}/"
started = time.monotonic()
for _ in range(300):
    try: urllib.request.urlopen(url, timeout=5); break
    except OSError: time.sleep(1)
prompt = next(p.text for p in load_prompts() if p.id == "HumanEval/0")
args = [prompt, "staged", "qwen-coder", "", "", "greedy", 1.0, 50, 1.0, 0, 12, "auto", 8, 4, STAGED_LOOKUP, 64]
def rates(table):
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"[|\t]", line) if c.strip()]
        if len(cells) >= 2 and cells[0] in COMPARED: out[cells[0]] = float(cells[1])
    return out
def winner(r): return max(r, key=r.get)
try:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"], headless=True)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(url); page.locator("#step-btn").wait_for()
        print(f"page answers {time.monotonic() - started:.1f} s after start", flush=True)
        for step in (1, 2):
            page.locator("#step-btn").click()
            page.locator("#caption").filter(has_text=f"Step {step}").wait_for(timeout=300_000)
            print(f"Step {step} lands {time.monotonic() - started:.1f} s after start", flush=True)
        page.get_by_role("tab", name="Compare").click()
        h = rates(Client(url, verbose=False).predict(*args, api_name="/on_compare")[7]); print("warm-up headless", h, flush=True)
        for run in range(int(sys.argv[1])):
            h = rates(Client(url, verbose=False).predict(*args, api_name="/on_compare")[7])
            print(f"headless {run}: winner {winner(h)}", h, flush=True)
            t = time.monotonic(); page.locator("#compare-btn").click()
            while "Race finished" in page.locator("#status").inner_text(): time.sleep(0.05)
            while "Race finished" not in page.locator("#status").inner_text(): time.sleep(0.2)
            v = time.monotonic() - t
            b = rates(page.locator("#compare-table").inner_text())
            print(f"browser {run}: winner {winner(b)}, verdict {v:.1f} s", b, flush=True)
            print("   ", re.search(r"From Compare.*?replay [\d.]+ s", page.locator("#status").inner_text()).group(0), flush=True)
        browser.close()
    rss = next(line for line in open(f"/proc/{proc.pid}/status") if line.startswith("VmRSS"))
    print(f"server {rss.split(':')[1].strip()} resident", flush=True)
finally:
    proc.terminate(); proc.wait()
