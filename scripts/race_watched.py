"""A race watched in Chromium against the same race headless (through the server's API, nothing watching), in one
server on the same machine: each lane's tokens/s both ways, the winner and the time from the click to the verdict.
First, from a fresh server: when the page answers, when the first Step lands and when a second one does; last, the
server's resident memory. A benchmark, not a test: timings belong where a person reads them on a quiet machine,
not in the unit suite, whose tests check what is timed and in which order against recorded clocks.

Each round is a headless race, a watched one and a headless one, after one headless race to warm up. The checks
(what the app promises about a watched race): in some round every lane runs at least 85% of the slower headless race
beside it (and at most 130% of the faster: more is the machine's noise), the winner is the headless races' winner
unless they put the first two within 15% of each other, and the verdict comes within 1.5x the lanes' own times added
up. It prints a table, writes JSON (--out), and exits 1 where a check fails.
    .venv/bin/python scripts/race_watched.py [--rounds 2] [--preset qwen-coder] [--tokens 64] [--out FILE]
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from specviz.app.race import COMPARED, SHOWN  # noqa: E402
from specviz.bench.prompts import load_prompts  # noqa: E402
from specviz.stack.strategies import STAGED_LOOKUP  # noqa: E402

SLOWER = 0.85         # a watched lane at least this share of the slower headless race beside it
FASTER = 1.3          # ... and at most this share of the faster one
CLEAR_WIN = 1.15      # the headless winner is clear where it beats the second by this much
VERDICT = 1.5         # the verdict within this many times the lanes' own times added up


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
    raise SystemExit(f"the app did not answer at {url}")


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
    from gradio_client import Client
    reply = Client(url, verbose=False).predict(*args, api_name="/on_compare")
    return rates(reply[2 + len(SHOWN)])


def watched_race(page) -> dict:
    """Click Compare and wait for the verdict: the lanes' tokens/s, the seconds from the click, the lanes' own."""
    started = time.monotonic()
    page.locator("#compare-btn").click()
    while "Race finished" in page.locator("#status").inner_text():
        time.sleep(0.05)
    while "Race finished" not in page.locator("#status").inner_text():
        time.sleep(0.2)
    verdict_s = time.monotonic() - started
    columns = [page.locator(f"#race-{name}").inner_text() for name in SHOWN]
    lanes_s = [float(m.group(1)) for m in (re.search(r"tokens · ([\d.]+) s", c) for c in columns) if m]
    return {"rates": rates(page.locator("#compare-table").inner_text()), "verdict_s": verdict_s, "lanes_s": lanes_s}


def checks(watched: dict, before: dict[str, float], after: dict[str, float]) -> dict[str, bool]:
    """Each lane within the headless races' span, the winner, and the verdict's wait, for one round."""
    lanes = {lane: SLOWER * min(before[lane], after[lane]) <= rate <= FASTER * max(before[lane], after[lane])
             for lane, rate in watched["rates"].items() if lane in before and lane in after}
    ranked = sorted(before, key=before.get, reverse=True)
    clear = len(ranked) > 1 and before[ranked[0]] > CLEAR_WIN * before[ranked[1]] and winner(after) == ranked[0]
    return {**lanes, "the winner": not clear or winner(watched["rates"]) == ranked[0],
            "the verdict": watched["verdict_s"] <= VERDICT * sum(watched["lanes_s"])}


def yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def table(rounds: list[dict], passed: dict[str, bool]) -> str:
    lanes = sorted({lane for r in rounds for lane in r["watched"]["rates"]}, key=COMPARED.index)
    head = "| lane | " + " | ".join(f"round {i}: headless, watched, headless (tok/s)" for i in range(len(rounds)))
    lines = [head + " | passes |", "| --- |" + " ---: |" * len(rounds) + " --- |"]
    for lane in lanes:
        cells = [f"{r['before'].get(lane, 0):.1f}, **{r['watched']['rates'].get(lane, 0):.1f}**, "
                 f"{r['after'].get(lane, 0):.1f}" for r in rounds]
        lines.append(f"| {lane} | " + " | ".join(cells) + f" | {yes(passed.get(lane, False))} |")
    waits = [f"{r['watched']['verdict_s']:.1f} s (lanes {sum(r['watched']['lanes_s']):.1f} s)" for r in rounds]
    lines.append("| verdict after the click | " + " | ".join(waits) + f" | {yes(passed['the verdict'])} |")
    winners = [f"{winner(r['before'])}, **{winner(r['watched']['rates'])}**, {winner(r['after'])}" for r in rounds]
    lines.append("| the winner | " + " | ".join(winners) + f" | {yes(passed['the winner'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="headless, watched, headless: this many times")
    parser.add_argument("--preset", default="qwen-coder", help="the stack raced (the app's default: qwen-coder)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens a lane writes")
    parser.add_argument("--out", default=str(ROOT / "out" / "race_watched.json"), help="the JSON written")
    args = parser.parse_args(argv)

    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1",
           "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "SPECVIZ_PRESET": args.preset,
           "SPECVIZ_RACE_REUSE_S": "0.001"}     # every race timed anew: a race handed back would match itself
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    started = time.monotonic()
    prompt = next(p.text for p in load_prompts() if p.id == "HumanEval/0")
    race = [prompt, "staged", args.preset, "", "", "greedy", 1.0, 50, 1.0, 0, 12, "auto", 8, 4, STAGED_LOOKUP,
            args.tokens]
    result = {"preset": args.preset, "tokens": args.tokens, "rounds": []}
    try:
        wait_for(url)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                        args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(url)
            page.locator("#step-btn").wait_for()
            result["page_answers_s"] = time.monotonic() - started
            for step in (1, 2):
                page.locator("#step-btn").click()
                page.locator("#caption").filter(has_text=f"Step {step}").wait_for(timeout=300_000)
                result[f"step_{step}_lands_s"] = time.monotonic() - started
            page.locator("#examples input").click()
            page.get_by_role("option", name="HumanEval/0: has_close_elements").click()
            page.locator("#strategy label", has_text="staged").first.click()
            tokens = page.locator("#max-new-tokens input[type=number]")
            tokens.fill(str(args.tokens))
            tokens.press("Enter")
            page.get_by_role("tab", name="Compare").click()
            headless_race(url, race)                      # the first race warms what a first race meets
            after = headless_race(url, race)
            for _ in range(args.rounds):
                before, watched = after, watched_race(page)
                after = headless_race(url, race)
                result["rounds"].append({"before": before, "watched": watched, "after": after})
                print(f"round {len(result['rounds'])}: watched {watched}, headless {before} and {after}", flush=True)
            browser.close()
        rss = next(line for line in open(f"/proc/{proc.pid}/status") if line.startswith("VmRSS"))
        result["server_resident"] = rss.split(":")[1].strip()
    finally:
        proc.terminate()
        proc.wait()

    each = [checks(r["watched"], r["before"], r["after"]) for r in result["rounds"]]
    passed = {check: any(round_.get(check, False) for round_ in each) for check in set().union(*each)}
    print(f"page answers {result['page_answers_s']:.1f} s after start; "
          f"Step 1 lands at {result['step_1_lands_s']:.1f} s, Step 2 at {result['step_2_lands_s']:.1f} s; "
          f"server {result['server_resident']} resident")
    print(table(result["rounds"], passed))
    result["passed"] = passed
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    failed = [check for check, ok in passed.items() if not ok]
    print(f"wrote {args.out}; " + (f"FAILED: {', '.join(failed)}" if failed else "every check passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
