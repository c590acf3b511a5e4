"""`eaglespec serve`: the official `openai` client against a server on a free loopback port
(SmolLM2 in fp32 with its shipped head), a load test, fuzzed bodies, limits, and the page in a
headless browser."""

import collections
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import uvicorn

from eaglespec.api import Model
from eaglespec.decoding.generate import TextStream
from eaglespec.serve.app import Settings, create_app

KEY = "test-key"
NAME = "smollm2-135m-instruct"
PROMPTS = ["Name three colours.", "What is 12 times 7?", "Write a haiku about rain.", "Say hello in French.",
           "List two prime numbers.", "What is the capital of Italy?", "Give me a word that rhymes with cat.",
           "Count from one to five.", "What do bees make?", "Name a planet.", "What is water made of?",
           "Describe the sky in one sentence.", "What is 3 + 4?", "Name a fruit that is yellow.",
           "Spell the word 'dog' backwards.", "Who wrote Hamlet?"]


@pytest.fixture(scope="module")
def model(smollm2, shipped):
    return Model(smollm2, shipped)


@contextmanager
def serving(model, **settings):
    """A server in this process on a free loopback port: yields (base URL, app)."""
    app = create_app(model, Settings(**({"cache_tokens": 2048, "api_key": KEY} | settings)))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


@contextmanager
def cli_server(*options: str):
    """`eaglespec serve` in a process of its own on a free loopback port: yields its URL; it must
    stop cleanly on SIGTERM."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "EAGLESPEC_API_KEY"}
    server = subprocess.Popen([sys.executable, "-m", "eaglespec.cli", "serve", "--port", str(port), *options], env=env,
                              stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            assert server.poll() is None, server.stderr.read()
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        assert server.wait(60) == 0, "the server did not stop cleanly on SIGTERM"


def client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def expected(model, prompt: str, max_tokens: int, chat: bool = True):
    return model.generate(prompt, chat=chat, max_new_tokens=max_tokens, temperature=0.0)


def idle(app, seconds: float = 10.0) -> bool:
    """Wait for the engine to hold no request and no cache slot."""
    engine = app.state.engine
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if engine.scheduler.idle and not engine.jobs and not engine.scheduler.cache.lengths:
            return True
        time.sleep(0.05)
    return False


def test_openai_client(model):
    with serving(model) as (url, app):
        api = client(url)
        (listed,) = api.models.list().data
        assert listed.id == NAME and {"vanilla", "eagle", "pld", "hybrid"} <= set(listed.model_extra["methods"])
        want = expected(model, PROMPTS[0], 24)
        chat = api.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPTS[0]}],
                                           max_tokens=24, temperature=0)
        assert chat.choices[0].message.content == want.text
        assert chat.usage.completion_tokens == want.new_tokens
        assert chat.usage.prompt_tokens == want.prompt_tokens
        assert chat.choices[0].finish_reason == ("length" if want.finish_reason == "length" else "stop")
        extra = chat.model_extra["eaglespec"]
        assert extra["method"] == "eagle" and sum(extra["accepted"].values()) == want.new_tokens
        # one target token a round, but where max_tokens cut the round short
        assert extra["target_forwards"] - 1 <= extra["accepted"]["target"] <= extra["target_forwards"]

        # streaming: the chunks' text is the answer, and their spans are the chunks' text
        pieces, spans = [], []
        for chunk in api.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPTS[0]}],
                                                 max_tokens=24, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
                spans.append("".join(text for text, _ in chunk.model_extra["eaglespec"]["spans"]))
            if chunk.usage:
                assert chunk.usage.completion_tokens == want.new_tokens
        assert "".join(pieces) == want.text and spans == pieces

        # completions: text, a list of one text, and token ids; stop strings as generate's
        raw = "The three primary colours are"
        want = expected(model, raw, 16, chat=False)
        assert api.completions.create(model=NAME, prompt=raw, max_tokens=16, temperature=0).choices[0].text == want.text
        assert api.completions.create(model=NAME, prompt=[raw], max_tokens=16, temperature=0).choices[0].text == want.text
        ids = model.target.tokenizer(raw)["input_ids"]
        assert api.completions.create(model=NAME, prompt=ids, max_tokens=16, temperature=0).choices[0].text == want.text
        stop = want.text.split()[2]
        stopped = model.generate(raw, max_new_tokens=16, temperature=0.0, stop_strings=[stop])
        got = api.completions.create(model=NAME, prompt=raw, max_tokens=16, temperature=0, stop=[stop])
        assert got.choices[0].text == stopped.text and got.choices[0].finish_reason == "stop"
        assert got.usage.completion_tokens == stopped.new_tokens

        # a request naming its method; sampling with a seed draws what generate draws with it (with
        # vanilla decoding: a drafter's draws depend on the trees its sizing picks as it learns)
        sampled = model.generate(PROMPTS[2], chat=True, max_new_tokens=16, temperature=0.8, seed=7, method="vanilla")
        got = api.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPTS[2]}],
                                          max_tokens=16, temperature=0.8, seed=7, extra_body={"method": "vanilla"})
        assert got.choices[0].message.content == sampled.text
        assert got.model_extra["eaglespec"]["tau"] == 1.0 and got.model_extra["eaglespec"]["method"] == "vanilla"
        assert idle(app)


def test_errors(model):
    with serving(model, max_tokens=64, max_body_bytes=4096) as (url, app):
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").chat.completions.create(model=NAME, messages=messages, max_tokens=4)
        assert httpx.get(url + "/health").status_code == 200  # no key needed
        for path in ("/metrics", "/v1/models", "/v1/nothing"):  # every other path wants it, unknown ones too
            refused = httpx.get(url + path)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", path
        page = httpx.get(url + "/")
        assert page.status_code == 401 and page.headers["www-authenticate"].startswith("Basic")
        assert httpx.get(url + "/", auth=("anyone", KEY)).status_code == 200
        api = client(url)
        with pytest.raises(openai.NotFoundError) as error:
            api.chat.completions.create(model="gpt-9", messages=messages, max_tokens=4)
        assert error.value.body["code"] == "model_not_found"
        for bad in ({"temperature": 5}, {"max_tokens": 65}, {"n": 2}, {"top_p": 0}, {"logprobs": True},
                    {"extra_body": {"method": "warp-drive"}}):
            with pytest.raises(openai.BadRequestError):
                api.chat.completions.create(model=NAME, messages=messages, **({"max_tokens": 4} | bad))
        headers = {"Authorization": f"Bearer {KEY}"}
        huge = httpx.post(url + "/v1/completions", headers=headers, content=b'{"prompt": "' + b"a" * 5000 + b'"}')
        assert huge.status_code == 413 and huge.json()["error"]["message"]
        missing = httpx.get(url + "/v1/nothing", headers=headers)
        assert missing.status_code == 404 and "error" in missing.json()

        engine = app.state.engine  # a failure inside decoding: a 500 that says nothing of it
        step = engine.scheduler.step

        def broken():
            raise RuntimeError("secret internals")

        engine.scheduler.step = broken
        try:
            failed = httpx.post(url + "/v1/completions", headers=headers,
                                json={"model": NAME, "prompt": "hi", "max_tokens": 4}, timeout=60)
        finally:
            engine.scheduler.step = step
        assert failed.status_code == 500 and "secret" not in failed.text
        assert api.completions.create(model=NAME, prompt="hi", max_tokens=4, temperature=0).choices  # recovered
        metrics = httpx.get(url + "/metrics", headers=headers).text
        for name in ("eaglespec_requests_total", "eaglespec_queue_depth", "eaglespec_tokens_per_second",
                     "eaglespec_tau", "eaglespec_generated_tokens_total"):
            assert name in metrics
        assert idle(app)


def stream_answer(url: str, prompt: str, max_tokens: int) -> tuple[str, int]:
    text, usage = [], None
    for chunk in client(url).chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage.completion_tokens
    return "".join(text), usage


def test_load(model):
    """16 concurrent streaming clients: every greedy answer is generate's, token for token, and
    nothing stays behind (the engine empty, memory flat from one wave to the next)."""
    max_tokens = 32
    wants = [expected(model, p, max_tokens) for p in PROMPTS]
    with serving(model, max_batch=4, max_queue=16) as (url, app):
        rss = []
        for _wave in range(2):
            with ThreadPoolExecutor(16) as pool:
                answers = list(pool.map(lambda p: stream_answer(url, p, max_tokens), PROMPTS))
            for (text, usage), want in zip(answers, wants):
                assert text == want.text and usage == want.new_tokens
            assert idle(app)
            rss.append(psutil.Process().memory_info().rss)
        assert rss[1] - rss[0] < 64 << 20, f"memory grew by {(rss[1] - rss[0]) >> 20} MiB from one wave to the next"


def test_queue_full(model):
    with serving(model, max_batch=1, max_queue=1) as (url, app):
        start = threading.Barrier(4)

        def ask(prompt):
            start.wait()
            try:
                return stream_answer(url, prompt, 32)
            except openai.RateLimitError as error:
                assert error.response.headers["retry-after"]
                return None

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(ask, PROMPTS[:4]))
        assert None in answers, "4 requests at once with room for 2 were all taken"
        for answer, prompt in zip(answers, PROMPTS):
            if answer is not None:
                assert answer[0] == expected(model, prompt, 32).text
        assert idle(app)


def test_disconnect_cancels(model):
    with serving(model) as (url, app):
        body = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 400, "stream": True, "temperature": 0}
        with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=60) as response:
            lines = response.iter_lines()
            while not next(lines).startswith("data:"):
                pass
        assert idle(app), "the request kept decoding after its client went away"
        assert app.state.engine.metrics.requests.get("cancelled") == 1


@pytest.mark.slow  # loads the bundled model
def test_cli(tmp_path):
    """`eaglespec serve` itself: bad options fail before loading, a request is answered, SIGTERM
    stops it cleanly (`cli_server`), and a port already taken fails with one line."""
    bad = subprocess.run([sys.executable, "-m", "eaglespec.cli", "serve", "--max-batch", "0"], capture_output=True,
                         text=True)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == "error: --max-batch must be >= 1, got 0"
    bad = subprocess.run([sys.executable, "-m", "eaglespec.cli", "serve", "--port", "99999"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "Invalid value for '--port'" in bad.stderr.strip().splitlines()[-1]
    with cli_server("--max-batch", "2") as url:
        answer = client(url).completions.create(model=NAME, prompt="The capital of France is", max_tokens=8,
                                                temperature=0)
        assert answer.usage.completion_tokens == 8 and answer.model_extra["eaglespec"]["method"] == "eagle"
        port = url.rsplit(":", 1)[1]
        taken = subprocess.run([sys.executable, "-m", "eaglespec.cli", "serve", "--port", port], capture_output=True,
                               text=True)
        assert taken.returncode == 1 and "pick another --port" in taken.stderr.strip().splitlines()[-1]


def test_timeout(model):
    """A request past the per-request limit ends with a 408 and frees its rows."""
    with serving(model, timeout_s=0.5) as (url, app):
        with pytest.raises(openai.APIStatusError) as error:
            client(url).completions.create(model=NAME, prompt="Once upon a time", max_tokens=400, temperature=0)
        assert error.value.status_code == 408 and "max_tokens" in error.value.message
        assert idle(app)


def fuzz_bodies(rng: random.Random):
    """(path, body): valid requests with one to three fields replaced by odd values (most still
    decode), then bodies that are not JSON objects at all."""
    weird = ["", "\x00", "\ud800", "\udfff", "é" * 3, "🦅" * 50, "\u202e\u200b", "a" * 3000, None, True, -1, 0, 1,
             1.5, 10**30, -(10**30), 1e308, [], {}, [1, "a"], [0, 5, 7], {"a": {"b": [None]}}, "NaN", "stop", "vanilla",
             "pld", {"include_usage": True}, 2, 0.7, 2**63, 49151]
    fields = ["model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "n", "method",
              "stream_options", "logprobs", "prompt", "messages"]
    for k in range(240):
        chat = k % 2 == 1
        body = {"model": NAME, "max_tokens": 2, **({"messages": [{"role": "user", "content": "hi"}]} if chat
                                                   else {"prompt": "hi"})}
        for name in rng.sample(fields, rng.randint(1, 3)):
            if name == "messages" and rng.random() < 0.7:
                body[name] = [{"role": rng.choice(["user", "system", "assistant", "tool", 3]),
                               "content": rng.choice(weird + [[{"type": "text", "text": "hi"}], [{"type": "image"}]])}]
            else:
                body[name] = rng.choice(weird)
        raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        yield ("/v1/chat/completions" if chat else "/v1/completions"), raw
    for raw in (b"", b"{", b"[]", b"null", b'"text"', b"\xff\xfe", b"[" * 100000 + b"]" * 100000,
                b'{"model": "x", "prompt": NaN}', b'{"max_tokens": ' + b"9" * 5000 + b"}", b'{"a":1}' * 3):
        yield "/v1/completions", raw
        yield "/v1/chat/completions", raw


def test_fuzz(model):
    """Malformed JSON, wrong types, huge values, Unicode edge cases: answered 2xx or 4xx, never 500."""
    rng = random.Random(0)
    statuses = collections.Counter()
    with serving(model, max_tokens=4) as (url, app):
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        with httpx.Client(headers=headers, timeout=60) as http:
            for path, body in fuzz_bodies(rng):
                response = http.post(url + path, content=body)
                statuses[response.status_code] += 1
                assert response.status_code < 500, (body[:200], response.text)
                if response.status_code >= 400:
                    assert response.json()["error"]["message"]
            assert http.get(url + "/health").status_code == 200
        assert idle(app)
    assert statuses[200] >= 15 and statuses[400] >= 100, statuses  # both paths were exercised


def test_text_stream_pieces(smollm2):
    """The text comes out whole, in pieces tagged by the token that made them, and a stop string
    ends it as generate's does."""
    tokenizer = smollm2.tokenizer
    ids = tokenizer("Hello wörld 🦅, une tête!")["input_ids"]
    stream, out = TextStream(tokenizer), []
    for k in range(0, len(ids), 3):
        out += stream.add(ids[k:k + 3], [f"o{j}" for j in range(k, min(k + 3, len(ids)))])
    out += stream.finish()
    assert "".join(text for text, _ in out) == tokenizer.decode(ids)
    assert [origin for _, origin in out] == sorted({o for _, o in out}, key=lambda o: int(o[1:]))
    whole = [tokenizer.decode([i]) for i in ids]  # a token that is whole characters: its piece is its text
    assert all(text == whole[int(o[1:])] for text, o in out if "\ufffd" not in whole[int(o[1:])])
    assert sum("\ufffd" not in w for w in whole) >= len(ids) - 3
    stream = TextStream(tokenizer, ["tête"])
    text = "".join(t for t, _ in stream.add(ids, ["x"] * len(ids)))
    assert stream.stopped and text == "Hello wörld 🦅, une "


def browser_driver():
    """Headless Chromium through selenium, or the reason there is none."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None, "selenium is not installed (scripts/setup.sh installs it)"
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (binary and driver):
        return None, "no chromium / chromedriver (scripts/setup.sh installs Debian's chromium and chromium-driver)"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,800"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(driver)), None


@pytest.mark.browser
def test_page_in_browser(tmp_path):
    """The page of `eaglespec serve` (bf16, as served, with a 3-token chain so that every round
    drafts) loads, streams an answer and colours the drafted tokens. EAGLESPEC_SCREENSHOT=PATH
    keeps the screenshot (the README's is docs/serve-page.png)."""
    driver, reason = browser_driver()
    if driver is None:
        print(f"skipped: {reason}")
        pytest.skip(reason)
    from eaglespec.api import load

    model = load(NAME, "default", "bfloat16")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with cli_server("--method", "eagle:chain:3") as url:
        try:
            driver.get(url + "/")
            WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "model").text == NAME)
            driver.find_element(By.ID, "prompt").send_keys("Write a short poem about the sea.")
            driver.find_element(By.ID, "max").clear()
            driver.find_element(By.ID, "max").send_keys("48")
            driver.find_element(By.ID, "compare").click()
            driver.find_element(By.ID, "send").click()
            WebDriverWait(driver, 120).until(lambda d: "speculative is" in d.find_element(By.ID, "vanilla").text)
            path = Path(os.environ.get("EAGLESPEC_SCREENSHOT", tmp_path / "page.png"))
            driver.save_screenshot(str(path))
            assert path.stat().st_size > 10_000
            assert not driver.find_element(By.ID, "error").text
            drafted = driver.find_elements(By.CSS_SELECTOR, "#main .answer span.o-eagle")
            own = driver.find_elements(By.CSS_SELECTOR, "#main .answer span.o-target")
            assert drafted and own, "no token coloured as drafted and accepted, or none as the target's"
            answer = driver.find_element(By.CSS_SELECTOR, "#main .answer")
            text = driver.execute_script("return arguments[0].textContent", answer)  # the spans' text, exactly
            assert text == expected(model, "Write a short poem about the sea.", 48).text
        finally:
            driver.quit()
