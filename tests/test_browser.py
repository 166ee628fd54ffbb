"""The running app: `python app.py` started on a free port with the real offline default model, driven
in headless chromium (Playwright, Debian's chromium) and through its API with gradio_client. The browser
test steps, runs, races, samples, feeds bad input, and saves screenshots to out/screenshots/ (or to the
folder in SPECVIZ_SCREENSHOTS, e.g. docs/screenshots to refresh the README's pictures).
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from served import stop, wait_for_page
from test_app import BENCH

from specviz.app import settings as app_settings
from specviz.app.bench_panel import stack_of
from specviz.app.race import COMPARED, IN_TURN, SHOWN

ROOT = Path(__file__).resolve().parents[1]
LONG_RUN = 1000          # tokens: over two minutes of plain decoding on a 2-core CPU
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("app") / "server.log"
    bench = log.parent / "latest.json"
    target, drafts = stack_of("offline")             # a saved run of the stack on screen
    bench.write_text(json.dumps({**BENCH, "settings": {"target": target, "drafts": list(drafts)}}))
    env = {**os.environ, "SPECVIZ_BENCHMARK": str(bench), "GRADIO_SERVER_PORT": str(port),
           "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1",
           "SPACE_ID": "specviz/test",      # a Space: the page opens on the qwen-coder recording (gradio reads SPACE_ID
                                            # only where SYSTEM=spaces)
           # the small stack, whatever this machine's default: the page is under test here, and the
           # real qwen-coder pair in tests/test_qwen_coder.py (a 1.5B race would take minutes)
           "SPECVIZ_PRESET": "offline",
           "SPECVIZ_MAX_NEW_TOKENS": str(LONG_RUN)}      # a run long enough that Stop always comes first
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for_page(url, proc, log, 240)
        yield url
    finally:
        stop(proc)
    assert_no_traceback_but_input_checks(log.read_text())


def assert_no_traceback_but_input_checks(log: str) -> None:
    """Our handlers turn every failure into a message; the only tracebacks allowed in the server log
    are Gradio's own refusals of API values its components cannot take (e.g. a preset not offered)."""
    assert not re.search(r"handler \w+ failed", log), log[-3000:]
    for block in log.split("Traceback (most recent call last):")[1:]:
        assert "gradio.exceptions." in block, block[-3000:]


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(30_000)
        page.goto(server)
        page.locator("#step-btn").wait_for()
        page.opened_with = opened_with(page)
        leave_recording(page)
        yield page
        browser.close()


@pytest.fixture(autouse=True)
def _each_test_starts_on_the_step_tab(request):
    """The page is shared by the module's tests: one that failed on the Compare tab must not fail the next."""
    if "page" in request.fixturenames:
        request.getfixturevalue("page").get_by_role("tab", name="Step through").click()


def leave_recording(page) -> None:
    """A new page opens on a recording: once it shows one (the page's load events have run, so a click
    on the closed Recordings section is not lost), open that section and go back to live decoding, on the
    offline stack (the recording set the controls to its own, the qwen-coder pair)."""
    from playwright.sync_api import expect

    expect(page.locator("#status")).to_contain_text("Showing a recorded run", timeout=120_000)
    page.locator("#recordings-box").click()
    page.locator("#live-btn").click()
    expect(page.locator("#status")).to_contain_text("Back to live decoding")
    page.get_by_text("Models", exact=True).click()
    page.locator("#preset input").click()
    page.get_by_role("option", name=re.compile("^offline")).click()
    page.get_by_text("Models", exact=True).click()


def opened_with(page) -> dict:
    """What a new visitor sees before pressing anything (a Space opens on a recording)."""
    from playwright.sync_api import expect

    expect(page.locator("#status")).to_contain_text("Showing a recorded run", timeout=60_000)
    page.get_by_role("tab", name="Compare").click()
    expect(page.locator("#speed-plot .js-plotly-plot")).to_be_visible()
    shoot(page, "space-start-compare")
    seen = {"counters": page.locator("#counters").inner_text(), "speed": page.locator("#speed-md").inner_text(),
            "race": [page.locator(f"#race-{name}").inner_text() for name in SHOWN],
            "status": page.locator("#status").inner_text(), "checked": page.evaluate(PAGE_CHECK_JS)}
    seen["text"] = seen["checked"]["text"]
    page.get_by_role("tab", name="Step through").click()
    seen["tree"] = page.locator("#tree-plot .annotation-text").count()
    return seen


VIEWPORT = {"width": 1440, "height": 900}
LANE_MIN_PX = 280           # a lane's text box: code no longer wraps every few characters
PROSE_ABOVE_LANES = 150     # words a visitor reads above the lanes after a race (the settings column aside)
MACHINE_PATHS = re.compile(r"/root\b|/tmp\b|/home\b|\.cache\b")

# What a visitor sees of the Compare tab: the words of prose above the lanes (not in the settings column, buttons,
# tabs or the colour legend), each lane's text box width, and any special token, machine path or traceback.
PAGE_CHECK_JS = """() => {
  const lanes = [...document.querySelectorAll('[id^="race-"]')].filter(e => e.offsetParent !== null);
  const top = Math.min(...lanes.map(e => e.getBoundingClientRect().top));
  const settings = document.querySelector('#examples').closest('.column');
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let words = 0;
  while (walker.nextNode()) {
    const node = walker.currentNode, el = node.parentElement;
    if (!el || !node.textContent.trim() || settings.contains(el)) continue;
    if (el.closest('script,style,svg,button,[role=tab],[role=tablist],.tok-legend')) continue;
    const range = document.createRange(); range.selectNodeContents(node);
    const rects = [...range.getClientRects()].filter(r => r.width > 0 && r.height > 0);
    if (rects.length && rects[0].top < top) words += (node.textContent.match(/\\S+/g) || []).length;
  }
  const text = document.body.innerText;
  return {words: words,
          widths: Object.fromEntries(lanes.map(e => [e.id, Math.round((e.querySelector('.gen-text') || e)
                                                                      .getBoundingClientRect().width)])),
          special: text.match(/<\\|[^|<>\\s]*\\|>/g) || [], traceback: text.includes('Traceback'), text: text};
}"""


def check_page(seen: dict, where: str) -> None:
    """No special token, machine path or traceback is on the page."""
    assert not seen["special"], (where, seen["special"])
    assert not MACHINE_PATHS.search(seen["text"]), (where, MACHINE_PATHS.findall(seen["text"]))
    assert not seen["traceback"], where


def shots() -> Path:
    folder = Path(os.environ.get("SPECVIZ_SCREENSHOTS", ROOT / "out" / "screenshots"))
    folder = folder if folder.is_absolute() else ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shoot(page, name: str) -> None:
    page.mouse.move(0, 0)                 # no hover labels or tool bars in the picture
    page.screenshot(path=str(shots() / f"{name}.png"), full_page=True)


def set_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


# Each node of the tree figure with its position on the page, from the figure's own data: the
# plotted point (x, y) mapped through plotly's axes, and the first two lines of its hover text (the
# token, then the node's depth and rank, or what the root or the target's token is).
TREE_NODES_JS = """() => {
  const gd = document.querySelector('#tree-plot .js-plotly-plot');
  const box = gd.getBoundingClientRect(), fl = gd._fullLayout;
  const line = (h, i) => { const d = document.createElement('div'); d.innerHTML = h.split('<br>')[i] || '';
                           return d.querySelector('b') ? d.querySelector('b').textContent : d.textContent; };
  const nodes = [];
  gd.data.forEach(t => {
    if (t.meta !== 'nodes' && t.meta !== 'bonus') return;
    t.x.forEach((x, i) => nodes.push({
      kind: t.meta === 'bonus' ? 'bonus' : (t.customdata[i] === 0 ? 'root' : 'drafted'),
      px: box.left + fl._size.l + fl.xaxis.d2p(x), py: box.top + fl._size.t + fl.yaxis.d2p(t.y[i]),
      token: line(t.hovertext[i], 0), where: line(t.hovertext[i], 1)}));
  });
  return nodes;
}"""


def tree_nodes(page) -> list[dict]:
    return page.evaluate(TREE_NODES_JS)


@pytest.mark.browser
def test_a_space_opens_on_the_qwen_coder_recording_and_its_verdict_names_stageds_win(page):
    seen = page.opened_with
    assert "Showing a recorded run (recorded on AMD EPYC, 2 cores" in seen["status"]      # labelled with its machine
    assert "staged won at " in seen["status"] and "Every lane" in seen["status"]
    assert "recorded on " in seen["counters"] and seen["tree"] >= 2
    assert all("done ✓" in column for column in seen["race"]) and "tokens per pass" in seen["speed"]
    assert "doctest.testmod()⟨endoftext⟩" in seen["text"].replace("\n", "")     # the text ends where the model ends
    check_page(seen["checked"], "a Space's first view")


@pytest.mark.browser
def test_a_plot_saves_as_svg_and_png_from_the_buttons_at_its_corner(page, tmp_path):
    """plotly's own export of the plot on screen, saved by the browser: an SVG document and a PNG at twice the
    plot's size (every plot is wired alike: tests/test_plot_downloads.py)."""
    plot = page.locator("#accept-plot")
    shown = plot.locator(".js-plotly-plot").bounding_box()
    for name, begins in (("SVG", b"<svg"), ("PNG", b"\x89PNG\r\n\x1a\n")):
        with page.expect_download() as download:
            plot.get_by_role("button", name=name, exact=True).click()
        saved = tmp_path / download.value.suggested_filename
        download.value.save_as(saved)
        assert saved.name == f"specviz-accept.{name.lower()}" and saved.read_bytes().startswith(begins)
    width = int.from_bytes(saved.read_bytes()[16:20], "big")                # the PNG's header
    assert abs(width - 2 * shown["width"]) <= 4


@pytest.mark.browser
@pytest.mark.timeout(900)
def test_step_run_compare_stop_and_bad_input_in_a_browser(page, server):
    from playwright.sync_api import expect

    status = page.locator("#status")
    page.locator("#examples input").click()
    page.get_by_role("option", name="HumanEval/0: has_close_elements").click()
    expect(page.locator("#prompt textarea")).to_have_value(re.compile("def has_close_elements"))
    # the pattern, which the offline stack's 135M target is sure of: on HumanEval/0 it is unsure enough (0.5-0.7 a
    # token) that staged's planner holds every probe and all 20 steps are plain
    page.locator("#examples input").click()
    page.get_by_role("option", name="Pattern: days of the week").click()
    expect(page.locator("#prompt textarea")).to_have_value(app_settings.NATURAL_PROMPTS["Pattern: days of the week"])
    set_number(page, "max-new-tokens", 20)
    page.locator("#strategy label", has_text="staged").first.click()

    # Step: a tree figure with token labels and coloured text appear, with a caption
    page.locator("#step-btn").click()
    expect(page.locator("#caption")).to_contain_text("Step 1", timeout=240_000)
    expect(page.locator("#tree-plot .js-plotly-plot")).to_be_visible()
    expect(page.locator("#tree-plot .legend")).to_be_visible()
    assert page.locator("#tree-plot .annotation-text").count() >= 2       # root + at least the target's token
    tokens = page.locator("#gen-text span.tok[data-stage]")
    assert tokens.count() >= 1
    assert "background" in tokens.first.get_attribute("style")
    # Which tokens a real model drafts at a given step differs between CPUs (float kernels differ in
    # the last bits), and so does the tree plan measured at setup (where a draft level costs much against a target
    # token it asks the draft for a path's chance of 0.66-0.74), so step until a step has drafted something, up to the
    # 20 tokens' end, then hover every node of that tree.
    drafted = []
    for number in range(2, 21):
        page.locator("#step-btn").click()
        expect(page.locator("#caption")).to_contain_text(f"Step {number}", timeout=120_000)
        nodes = tree_nodes(page)
        drafted = [n for n in nodes if n["kind"] == "drafted"]
        if drafted or "finished" in page.locator("#counters").inner_text():
            break
    assert drafted, f"no step up to {number} drafted a node: {nodes}"
    shoot(page, "step")
    hover = page.locator("#tree-plot .hoverlayer")
    for node in nodes:                       # each node, newline tokens too, answers with its own hover
        page.mouse.move(node["px"], node["py"])
        expect(hover).to_contain_text(node["token"], timeout=5_000)
        expect(hover).to_contain_text(node["where"], timeout=5_000)
    page.mouse.move(drafted[0]["px"], drafted[0]["py"])
    for line in ("draft probability q", "target probability p", "acceptance probability"):
        expect(hover).to_contain_text(line)
    page.locator("#tree-plot").screenshot(path=str(shots() / "hover.png"))

    # Run: plays to the end (20 tokens, or fewer where the model ends its text) with counters; the
    # acceptance heat map is drawn
    page.locator("#run-btn").click()
    expect(status).to_contain_text("Finished", timeout=300_000)
    expect(page.locator("#counters")).to_contain_text(re.compile(r"Tokens \d+ / 20 .*finished ✓"))
    expect(page.locator("#accept-plot .js-plotly-plot")).to_be_visible()
    shoot(page, "run")

    # Compare: the race fills every lane, the answer comes first and the method on request, then the charts
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-btn").click()
    expect(status).to_contain_text("Race finished", timeout=400_000)
    # the verdict's first sentence: who won, by how much, against what; then whether every lane wrote the same text
    expect(status).to_contain_text(re.compile(r"Race finished\. \w+ (\(llama\.cpp's plain decoding, the reference\) )?"
                                              r"won at [\d.]+ tokens/s(: [\d.]+× (llama\.cpp's plain decoding|our "
                                              r"baseline))?"))
    expect(status).to_contain_text(re.compile(r"(Every lane wrote exactly|Differs from) baseline's text"))
    checked = page.evaluate(PAGE_CHECK_JS)          # what a visitor reads above the lanes, every fold closed
    assert checked["words"] <= PROSE_ABOVE_LANES, checked["words"]
    assert min(checked["widths"].values()) >= LANE_MIN_PX and len(checked["widths"]) == len(SHOWN), checked["widths"]
    check_page(checked, "after a race")
    page.set_viewport_size({"width": 1280, "height": 720})            # a classroom projector
    projector = page.evaluate(PAGE_CHECK_JS)["widths"]
    page.set_viewport_size(VIEWPORT)
    assert min(projector.values()) >= LANE_MIN_PX, projector
    measured = page.locator("#measured-md")
    expect(measured).to_be_hidden()                                    # the method folds ...
    page.get_by_text("How this was measured", exact=True).click()                  # ... and opens on request
    expect(measured).to_contain_text("How it is timed. Each step of each lane runs alone")
    expect(measured).to_contain_text(re.compile(r"Analysis of staged's rounds .* a round took \d+ ms"))
    expect(page.locator("#compare-more")).not_to_contain_text(IN_TURN)      # a view's help: two sentences shown ...
    page.locator("#compare-more").click()
    expect(page.locator("#compare-more")).to_contain_text(IN_TURN)          # ... the rest on request
    page.locator("#compare-more").click()
    for name in COMPARED:
        if name == "llama_cpp_speculative":       # the offline stack's draft is no GGUF file
            expect(page.locator(f"#race-{name}")).to_contain_text("needs a GGUF draft model")
        else:
            expect(page.locator(f"#race-{name}")).to_contain_text("done ✓")
    expect(page.locator("#compare-table")).to_contain_text("vs reference (llama.cpp plain")
    expect(page.locator("#regime-md")).to_contain_text("Analysis (from these curves")
    expect(page.locator("#regime-plot .js-plotly-plot")).to_be_visible()
    for chart in ("latency-plot", "forwards-plot", "memory-plot"):
        expect(page.locator(f"#{chart} .js-plotly-plot")).to_be_visible()
        expect(page.locator(f"#{chart} .legend")).to_be_visible()
    expect(page.locator("#compare-table")).to_contain_text("tokens per target pass")
    expect(page.locator("#bench-plot .js-plotly-plot")).to_be_visible()         # benchmark results shown
    expect(page.locator("#bench-table")).to_contain_text("12.5")
    expect(page.locator("#speed-md")).to_contain_text("tokens per pass")      # why it is fast, for this race
    expect(page.locator("#speed-plot .legend")).to_be_visible()
    page.get_by_text("Benchmark results (python -m specviz.bench)").click()    # fold the test's made-up results
    expect(page.locator("#bench-plot")).to_be_hidden()
    shoot(page, "compare-measured")
    page.get_by_text("How this was measured", exact=True).click()
    expect(measured).to_be_hidden()
    shoot(page, "compare")
    page.locator("#speed-box").screenshot(path=str(shots() / "why-fast.png"))

    # Is it lossless: under greedy the lanes token by token; sampled, the next token's distribution
    page.locator("#lossless-box").click()
    page.locator("#lossless-btn").click()
    expect(page.locator("#lossless-md")).to_contain_text("Greedy, against baseline's tokens")
    page.get_by_text("Sampling", exact=True).click()
    page.locator("#mode label", has_text="sample").first.click()
    set_number(page, "lossless-n", 30)
    page.locator("#lossless-btn").click()
    expect(status).to_contain_text("Sampled 30 next tokens per lane", timeout=300_000)
    expect(page.locator("#lossless-md")).to_contain_text("p = ")
    expect(page.locator("#lossless-plot .legend")).to_be_visible()
    page.locator("#lossless-box").screenshot(path=str(shots() / "lossless.png"))
    page.locator("#mode label", has_text="greedy").first.click()

    # Stop ends a long run; meanwhile another user's session steps on its own. The pattern prompt keeps
    # any model listing days for LONG_RUN tokens, so the run is still going when Stop comes.
    page.get_by_role("tab", name="Step through").click()
    page.locator("#examples input").click()
    page.get_by_role("option", name=app_settings.PATTERN_EXAMPLE).click()
    page.locator("#strategy label", has_text="baseline").first.click()
    set_number(page, "max-new-tokens", LONG_RUN)
    page.locator("#run-btn").click()
    expect(status).to_contain_text("Running", timeout=120_000)
    second_user = page.context.browser.new_context()
    other = second_user.new_page()
    other.goto(server)
    leave_recording(other)
    other.locator("#step-btn").click()
    expect(other.locator("#caption")).to_contain_text("Step 1", timeout=120_000)
    expect(page.locator("#status")).to_contain_text("Running")        # the first user's run goes on
    page.locator("#stop-btn").click()
    expect(status).to_contain_text("Stopped after", timeout=60_000)
    # the loop's last output: the counters drawn with it show the tokens it says it stopped at, short of the run
    stopped_at = int(re.search(r"Stopped after (\d+) tokens", status.inner_text()).group(1))
    assert 0 < stopped_at < LONG_RUN
    expect(page.locator("#counters")).to_contain_text(f"Tokens {stopped_at} / {LONG_RUN}")
    second_user.close()

    # Bad input: an empty prompt and a model that cannot load give a message, and the app stays up
    page.locator("#prompt textarea").fill("")
    page.locator("#step-btn").click()
    expect(status).to_contain_text("prompt is empty", timeout=60_000)
    shoot(page, "bad-input")
    # A public server offers no custom model ids by default: the presets only
    page.get_by_text("Models", exact=True).click()
    page.locator("#preset input").click()
    expect(page.get_by_role("option", name=re.compile("^qwen-coder"))).to_be_visible()
    assert page.get_by_role("option", name=re.compile("^custom")).count() == 0
    page.keyboard.press("Escape")
    assert "Traceback" not in page.content()


@pytest.mark.browser
def test_recordings_replay_in_a_browser_and_hostile_files_show_as_text(page, tmp_path):
    """A shipped recording replays (Step, Compare) with no model needed; an uploaded file whose tokens
    are HTML shows them as text; a broken file gives one line and changes nothing."""
    from playwright.sync_api import expect

    from specviz import recording as rec

    status = page.locator("#status")
    page.locator("#recordings-box").click()
    page.locator("#recordings input").click()
    name = next(iter(rec.shipped()))
    page.get_by_role("option", name=re.compile(re.escape(name))).click()
    page.locator("#open-btn").click()
    expect(status).to_contain_text("Opened a recording (recorded on ")
    recording = rec.load(rec.shipped()[name])
    expect(page.locator("#prompt textarea")).to_have_value(recording.settings["prompt"])
    page.locator("#step-btn").click()
    expect(page.locator("#counters")).to_contain_text("recorded on ")
    expect(page.locator("#tree-plot .js-plotly-plot")).to_be_visible()
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-btn").click()
    # The replay paces itself by the recorded times (about 8 s), but every tick redraws the lanes: with the
    # other test worker loading the qwen-coder pair beside it, 120 s once ran out at 35-59 of 64 tokens.
    expect(status).to_contain_text("Race finished", timeout=360_000)
    expect(page.locator("#compare-table")).to_contain_text("timings as recorded")
    for lane in recording.race:      # a lane the recorded race skipped says why, as it did live
        expect(page.locator(f"#race-{lane}")).to_contain_text("not in this race" if lane in recording.skipped
                                                              else "done ✓")
    shoot(page, "replay-compare")
    page.get_by_role("tab", name="Step through").click()

    data = recording.to_dict()
    hostile = '<img src=x onerror="document.title=1">'
    for lane in data["lanes"].values():
        for step in lane["steps"]:
            step["committed_text"] = [hostile] * len(step["committed_text"])
            for node in step["nodes"]:
                node["text"] = hostile
    bad_file = tmp_path / "hostile.json"
    bad_file.write_text(json.dumps(data))
    page.locator("#upload-recording input[type=file]").set_input_files(str(bad_file))
    expect(status).to_contain_text("Opened a recording")
    page.locator("#step-btn").click()
    expect(page.locator("#gen-text")).to_contain_text(hostile)           # shown as text ...
    assert page.locator("#gen-text img, #caption img, #tree-plot img").count() == 0     # ... never as HTML
    assert page.title() != "1"

    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "specviz-recording", "version": 1}')
    page.locator("#upload-recording button[aria-label='Clear']").first.click()
    page.locator("#upload-recording input[type=file]").set_input_files(str(broken))
    expect(status).to_contain_text("This file cannot be replayed")
    expect(page.locator("#gen-text")).to_contain_text(hostile)           # the open replay is untouched
    page.locator("#live-btn").click()
    expect(status).to_contain_text("Back to live decoding")


# -- the real server through its API (what any visitor's script can send) ---------------------------

API_ARGS = dict(prompt="def add(a, b):\n", strategy="baseline", preset="offline", target="", drafts="",
                mode="greedy", temperature=1.0, top_k=50, top_p=1.0, seed=0, budget=12, shape="auto",
                max_depth=8, max_branch=4, lookup=10, max_new=12, prompt_format="completion")


def api_call(client, endpoint="/on_step", **change):
    return client.predict(*{**API_ARGS, **change}.values(), api_name=endpoint)


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_the_api_refuses_bad_values_clearly_and_users_do_not_disturb_each_other(server):
    from concurrent.futures import ThreadPoolExecutor

    from gradio_client import Client

    def client():
        return Client(server, verbose=False)

    def status_of(reply) -> str:
        return reply[0] if isinstance(reply, (list, tuple)) else str(reply)

    bad = [dict(prompt=""), dict(prompt="x" * (app_settings.MAX_PROMPT_CHARS + 1)),
           dict(strategy="staged", budget=10**6), dict(mode="sample", temperature=1e9), dict(max_new=10**9),
           dict(lookup=-5), dict(shape="spiral")]
    visitor = client()
    for change in bad:
        try:
            status = status_of(api_call(visitor, **change))
        except Exception as exc:       # Gradio refused a value its component cannot take: one clear line
            status = str(exc)
        assert status.strip() and "Traceback" not in status and "\n" not in status.strip(), (change, status)
    for change in (dict(budget="many"), dict(seed="x"), dict(max_new=[1])):       # wrong types: named, one line
        with pytest.raises(Exception, match="must be a number"):
            api_call(visitor, **change)
    refused = ((app_settings.CUSTOM, "/etc"), ("no-such-preset", ""), (app_settings.CUSTOM, "org/huge-model"))
    for preset, target in refused:
        with pytest.raises(Exception, match="not in the list of choices"):
            api_call(visitor, preset=preset, target=target)

    # eight users at once, each running a different strategy to the end, get what a lone user gets
    alone = status_of(api_call(visitor, "/on_run", strategy="baseline"))
    assert "Finished" in alone
    lone_text = api_call(client(), "/on_run", strategy="baseline")[2]

    # one visitor pressing Step, Run, Step, Reset and Stop at once: each gets an answer, and the session
    # still runs to baseline's text afterwards
    same = client()
    jobs = [same.submit(*{**API_ARGS, "strategy": "staged"}.values(), api_name=name)
            for name in ("/on_step", "/on_run", "/on_step")]
    jobs += [same.submit(api_name="/on_reset"), same.submit(api_name="/on_stop")]
    for job, name in zip(jobs, ("step", "run", "step", "reset", "stop")):
        reply = job.result(timeout=300)
        assert "Traceback" not in str(reply) and "went wrong" not in str(reply), (name, reply)
        assert name == "stop" or status_of(reply).strip(), (name, reply)     # Stop may leave the status to Run
    final = api_call(same, "/on_run", strategy="staged")
    assert "Finished" in status_of(final) and plain_text(final[2]) == plain_text(lone_text)
    strategies = ["baseline", "speculative", "tree", "staged"] * 2
    users = [client() for _ in strategies]             # each Client is one session, as one browser tab
    with ThreadPoolExecutor(len(users)) as pool:
        replies = list(pool.map(lambda us: api_call(us[0], "/on_run", strategy=us[1]), zip(users, strategies)))
    for strategy, reply in zip(strategies, replies):
        assert "Finished" in status_of(reply), (strategy, reply[0])
        assert plain_text(reply[2]) == plain_text(lone_text), strategy
    assert "Finished" in status_of(api_call(visitor, "/on_run", strategy="tree"))     # the server is alive


def plain_text(page_html: str) -> str:
    """The generated text of the coloured-text HTML, without the tags and the stage tints."""
    import html as html_lib
    body = page_html.split('<div class="gen-text">', 1)[-1]
    return html_lib.unescape(re.sub(r"<[^>]+>", "", body))
