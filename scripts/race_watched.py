"""The app's default race (qwen-coder, HumanEval/0, greedy, 64 tokens), headless through the server's API and
watched in Chromium on the same machine, alternating in one server: each lane's tokens/s both ways, the winner and
the time from the click to the verdict. First, from a fresh server: when the page answers, when the first Step lands
and when a second one does; last, the server's resident memory. A benchmark, not a test: a watched race's timing
belongs here, where a person reads it, not in the unit suite.
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, tries: int = 300) -> None:
    for _ in range(tries):
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        except OSError:
            time.sleep(1)


def rates(table: str) -> dict[str, float]:
    """Each lane's tokens/s, read from the race's table (the API's text or the page's)."""
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"[|\t]", line) if c.strip()]
        if len(cells) >= 2 and cells[0] in COMPARED:
            out[cells[0]] = float(cells[1])
    return out


def winner(lanes: dict[str, float]) -> str:
    return max(lanes, key=lanes.get)


def headless_race(url: str, args: list) -> dict[str, float]:
    return rates(Client(url, verbose=False).predict(*args, api_name="/on_compare")[7])


def watched_race(page) -> tuple[dict[str, float], float]:
    """Click Compare and wait for the verdict: the lanes' tokens/s and the seconds from the click."""
    started = time.monotonic()
    page.locator("#compare-btn").click()
    while "Race finished" in page.locator("#status").inner_text():
        time.sleep(0.05)
    while "Race finished" not in page.locator("#status").inner_text():
        time.sleep(0.2)
    return rates(page.locator("#compare-table").inner_text()), time.monotonic() - started


def main(rounds: int) -> None:
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1",
           "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([f"{ROOT}/.venv/bin/python", "app.py"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    started = time.monotonic()
    wait_for(url)
    prompt = next(p.text for p in load_prompts() if p.id == "HumanEval/0")
    args = [prompt, "staged", "qwen-coder", "", "", "greedy", 1.0, 50, 1.0, 0, 12, "auto", 8, 4, STAGED_LOOKUP, 64]
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                        args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(url)
            page.locator("#step-btn").wait_for()
            print(f"page answers {time.monotonic() - started:.1f} s after start", flush=True)
            for step in (1, 2):
                page.locator("#step-btn").click()
                page.locator("#caption").filter(has_text=f"Step {step}").wait_for(timeout=300_000)
                print(f"Step {step} lands {time.monotonic() - started:.1f} s after start", flush=True)
            page.get_by_role("tab", name="Compare").click()
            print("warm-up headless", headless_race(url, args), flush=True)
            for run in range(rounds):
                headless = headless_race(url, args)
                print(f"headless {run}: winner {winner(headless)}", headless, flush=True)
                watched, verdict_s = watched_race(page)
                print(f"browser {run}: winner {winner(watched)}, verdict {verdict_s:.1f} s", watched, flush=True)
                timing = re.search(r"From Compare.*?replay [\d.]+ s", page.locator("#status").inner_text())
                print("   ", timing.group(0) if timing else "(no timing line)", flush=True)
            browser.close()
        rss = next(line for line in open(f"/proc/{proc.pid}/status") if line.startswith("VmRSS"))
        print(f"server {rss.split(':')[1].strip()} resident", flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
