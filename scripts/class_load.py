"""A class arriving at one app server: N visitors (default 30), one a second, each with a session of their own, press
Step and then Run through the app's API (gradio_client), as issue 76's class did. A load script, not a test: its
timings belong to the machine it ran on.

It starts `app.py` with default settings on a free loopback port (or uses a running one: --url, loopback addresses
only) and waits until live mode is ready. Each visitor asks for the app's default request (the page's own defaults),
or with --different-prompts a HumanEval prompt of their own, which no other visitor can share. It prints a table per
visitor (arrival, when the page answered, the first Step's reply, Run's end, the longest wait in Gradio's queue or
in line for a decoder, whether the text equals a private decode) and writes JSON. The private decodes run in this
process after the server is stopped, through the app's own code (the same settings, a decoder of its own).
    .venv/bin/python scripts/class_load.py [--visitors 30] [--every 1] [--different-prompts] [--out FILE]
"""
import argparse
import html
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from specviz.app import settings as app_settings  # noqa: E402

MAX_VISITORS = 200          # bounded: a script for a class, not a flood
LOOPBACK = ("127.0.0.1", "localhost", "::1")
STEP_GOAL_S, RUN_GOAL_S = 10.0, 60.0      # the goals, from each visitor's arrival


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(log: Path, ready_s: float) -> tuple[subprocess.Popen, str]:
    """app.py with default settings on a free loopback port, once live mode says it is ready."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        app = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}/", time.monotonic() + ready_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if app.poll() is not None:
            raise SystemExit(f"app.py exited with {app.returncode}:\n{text[-2000:]}")
        if "live mode: Live mode runs" in text or "Live mode could not get ready" in text:
            try:
                urllib.request.urlopen(url, timeout=5)
                return app, url
            except OSError:
                pass
        time.sleep(1)
    app.terminate()
    raise SystemExit(f"live mode was not ready within {ready_s:.0f} s (log: {log})")


def plain_text(page_html: str) -> str:
    """The text of the coloured-text HTML (prompt and output), without tags."""
    return html.unescape(re.sub(r"<[^>]+>", "", page_html.split('<div class="gen-text">', 1)[-1]))


def machine() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines()
    except OSError:
        return "unknown"
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs"


class Visitor(threading.Thread):
    """One visitor: arrives, opens the page (a session of its own), presses Step, then Run."""

    def __init__(self, number: int, url: str, arrival_s: float, values: list, began: float, limit_s: float):
        super().__init__(daemon=True)
        self.number, self.url, self.arrival_s, self.values = number, url, arrival_s, values
        self.began, self.limit_s = began, limit_s
        self.row = {"visitor": number, "arrival_s": arrival_s, "page_s": None, "step_s": None, "run_s": None,
                    "queue_rank": None, "in_line": "", "step_status": "", "status": "", "text": "",
                    "error": ""}

    def call(self, client, endpoint: str):
        """The endpoint's final reply; meanwhile the longest wait seen: Gradio's queue rank, our line's message."""
        job = client.submit(*self.values, api_name=endpoint)
        while not job.done():
            status = job.status()
            if status.rank is not None and status.rank > 0:
                self.row["queue_rank"] = max(self.row["queue_rank"] or 0, status.rank)
            for output in job.outputs()[-1:]:
                if "Waiting for a decoder" in str(output[0]) and not self.row["in_line"]:
                    self.row["in_line"] = str(output[0])
            time.sleep(0.5)
        return job.result(timeout=self.limit_s)

    def run(self) -> None:
        from gradio_client import Client
        time.sleep(max(0.0, self.began + self.arrival_s - time.monotonic()))
        arrived = time.monotonic()
        try:
            client = Client(self.url, verbose=False)
            self.row["page_s"] = time.monotonic() - arrived
            step = self.call(client, "/on_step")
            self.row["step_s"] = time.monotonic() - arrived
            self.row["step_status"] = str(step[0])
            run = self.call(client, "/on_run")
            self.row["run_s"] = time.monotonic() - arrived
            self.row["status"], self.row["text"] = str(run[0]), plain_text(str(run[2]))
        except Exception as exc:  # noqa: BLE001 - a visitor's failure is a row of the table, not the end of the run
            self.row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"


def request_values(url: str, prompts: list[str]) -> list[list]:
    """Each visitor's control values: the page's defaults, read from the app's API, with a prompt of its own where
    given."""
    from gradio_client import Client
    api = Client(url, verbose=False).view_api(print_info=False, return_format="dict")
    defaults = [p["parameter_default"] for p in api["named_endpoints"]["/on_step"]["parameters"]]
    return [[prompt, *defaults[1:]] if prompt else list(defaults) for prompt in prompts]


def private_texts(values: list[list]) -> list[str]:
    """Each request decoded alone, in this process, as the app renders it (same settings, a decoder of its own)."""
    from specviz.app import stacks, words
    texts, done = [], {}
    for value in values:
        settings = app_settings.settings_of_values(value)
        if settings not in done:
            decoder = stacks.new_decoder(stacks.get_stack(settings.stack_key()), settings)
            decoder.generate()
            done[settings] = plain_text(words.text_html(stacks.shown_prompt(decoder, settings), decoder.steps,
                                                        decoder.stages))
        texts.append(done[settings])
    return texts


def table(rows: list[dict]) -> str:
    def seconds(value):
        return "-" if value is None else f"{value:.1f}"
    lines = ["| visitor | arrival s | page s | first Step s | Run done s | queue rank | waited in line | shared | "
             "same text as a private decode | outcome |", "|" + " --- |" * 10]
    for r in rows:
        outcome = r["error"] or ("finished" if "Finished" in r["status"] else r["status"][:60])
        lines.append(f"| {r['visitor']} | {r['arrival_s']:.0f} | {seconds(r['page_s'])} | {seconds(r['step_s'])} | "
                     f"{seconds(r['run_s'])} | {r['queue_rank'] or '-'} | {'yes' if r['in_line'] else '-'} | "
                     f"{'yes' if 'Shared' in r['step_status'] else '-'} | "
                     f"{ {True: 'yes', False: 'NO', None: '-'}[r.get('same_text')]} | {outcome} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> dict:
    served = [r for r in rows if not r["error"] and "Finished" in r["status"]]
    steps = [r["step_s"] for r in rows if r["step_s"] is not None]
    runs = [r["run_s"] for r in rows if r["run_s"] is not None]
    return {"visitors": len(rows), "served": len(served), "refused_or_failed": len(rows) - len(served),
            "first_step_s": [min(steps, default=None), max(steps, default=None)],
            "run_done_s": [min(runs, default=None), max(runs, default=None)],
            "steps_within_goal": sum(s <= STEP_GOAL_S for s in steps), "runs_within_goal": sum(s <= RUN_GOAL_S
                                                                                            for s in runs),
            "same_text": sum(bool(r.get("same_text")) for r in rows)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--visitors", type=int, default=30)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between arrivals")
    parser.add_argument("--different-prompts", action="store_true", help="a HumanEval prompt of each visitor's own")
    parser.add_argument("--url", help="a running app on a loopback address, instead of starting app.py")
    parser.add_argument("--limit-s", type=float, default=900, help="the whole run's time limit")
    parser.add_argument("--ready-s", type=float, default=600, help="how long app.py may take to get ready")
    parser.add_argument("--no-private", action="store_true", help="skip the private decodes")
    parser.add_argument("--out", default=str(ROOT / "out" / "class_load.json"))
    args = parser.parse_args(argv)
    if not 1 <= args.visitors <= MAX_VISITORS or not 0 <= args.every <= 60:
        parser.error(f"--visitors must be 1 to {MAX_VISITORS}, --every 0 to 60 seconds")
    if args.url and urllib.parse.urlparse(args.url).hostname not in LOOPBACK:
        parser.error("--url must be a loopback address (127.0.0.1, localhost, ::1)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    app, url = (None, args.url) if args.url else start_app(out.with_suffix(".server.log"), args.ready_s)
    try:
        prompts = [None] * args.visitors
        if args.different_prompts:
            from specviz.bench.prompts import load_prompts
            prompts = [p.text for p in load_prompts(limit=args.visitors)]
            prompts += [f"{prompts[i % len(prompts)]}\n# visitor {i}\n" for i in range(len(prompts), args.visitors)]
        values = request_values(url, prompts)
        began = time.monotonic() + 1.0
        visitors = [Visitor(i + 1, url, i * args.every, values[i], began, args.limit_s) for i in range(args.visitors)]
        for visitor in visitors:
            visitor.start()
        for visitor in visitors:
            visitor.join(timeout=max(0.0, began + args.limit_s - time.monotonic()))
        rows = [dict(v.row, error=v.row["error"] or ("" if not v.is_alive() else f"not done in {args.limit_s:.0f} s"))
                for v in visitors]
    finally:
        if app is not None:
            app.terminate()
            app.wait(timeout=60)
    if not args.no_private:
        for row, text in zip(rows, private_texts(values)):
            row["same_text"] = bool(row["text"]) and row["text"] == text if not row["error"] else None
    report = {"machine": machine(), "url": url, "visitors": args.visitors, "every_s": args.every,
              "different_prompts": args.different_prompts, "summary": summary(rows),
              "settings": {name: value for name, value in zip(app_settings.SETTING_NAMES, values[0])
                           if name != "prompt"}, "rows": [{k: v for k, v in r.items() if k != "text"} for r in rows]}
    out.write_text(json.dumps(report, indent=1))
    print(f"{report['machine']}; {args.visitors} visitors, one every {args.every:g} s"
          f"{', each with a prompt of their own' if args.different_prompts else ', the default request'}")
    print(table(rows))
    print(json.dumps(report["summary"]))
    print(f"-> {out}")
    return 0 if report["summary"]["served"] == args.visitors else 1


if __name__ == "__main__":
    sys.exit(main())
