"""Issue 26, section 2 and the request fields of section 1, against a real server over the
embedded SmolLM2 (one engine and one server for the module, few tokens per request).

Every defect found by probing the server has its regression test here: a body above the limit
(413), templating off the event loop, tiny temperatures, a constraint that dead-ends, lone
surrogates (400 on a kept-alive connection), the metrics (prompt tokens per request, uploads cut
short, usage of streams aborted at shutdown) and lax validation. Then the fields clients send.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx
import jsonschema
import pytest

from engine import Engine
from engine.sampling_params import InvalidSamplingParams, SamplingParams
from server_harness import ServerThread

pytestmark = pytest.mark.slow

BODY_LIMIT = 256 * 1024
DEAD_END = {"type": "array", "uniqueItems": True, "minItems": 3, "items": {"type": "integer", "minimum": 0, "maximum": 1}}
SMALL = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine():
    with Engine(dtype="float32", max_total_tokens=8_000, max_running_requests=16, num_threads=1) as eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine):
    srv = ServerThread(engine, max_request_body_bytes=BODY_LIMIT)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


def _chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "Pick a number."}], "max_tokens": 8, "temperature": 0, **fields}


def _metric(http: httpx.Client, name: str, labels: str = "") -> float:
    text = http.get("/metrics").text
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _events(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


# --- section 2 --------------------------------------------------------------------------------


def test_body_above_the_limit_is_413_and_the_server_goes_on(http):
    big = _chat(messages=[{"role": "user", "content": "x" * (BODY_LIMIT + 10)}])
    r = http.post("/v1/chat/completions", json=big)
    assert r.status_code == 413, r.text
    assert http.get("/health").status_code == 200
    assert http.post("/v1/chat/completions", json=_chat()).status_code == 200


def test_templating_and_tokenizing_run_off_the_event_loop(server, engine, http, monkeypatch):
    threads: list[str] = []
    original = engine.apply_chat_template

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "apply_chat_template", spy)
    assert http.post("/v1/chat/completions", json=_chat()).status_code == 200
    assert threads and server.thread.name not in threads and "MainThread" not in threads


@pytest.mark.parametrize("temperature", [1e-38, 1e-30])
def test_tiny_temperature_is_greedy(http, temperature):
    greedy = http.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 6, "temperature": 0, "logprobs": 1}).json()
    tiny = http.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 6, "temperature": temperature, "logprobs": 1})
    assert tiny.status_code == 200, tiny.text
    body = tiny.json()
    assert body["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert None not in body["choices"][0]["logprobs"]["token_logprobs"]
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": SMALL}}
    r = http.post("/v1/chat/completions", json=_chat(temperature=temperature, max_tokens=16, response_format=fmt))
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), SMALL)


def test_a_constraint_that_dead_ends_finishes_cleanly(http):
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": DEAD_END}}
    r = http.post("/v1/chat/completions", json=_chat(max_tokens=40, response_format=fmt))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "dead_end"
    with http.stream("POST", "/v1/chat/completions", json=_chat(max_tokens=40, response_format=fmt, stream=True)) as s:
        events = _events(s)
    assert events[-1] == "[DONE]" and not any('"error"' in e for e in events)
    reasons = [c["finish_reason"] for e in events[:-1] for c in json.loads(e)["choices"] if c.get("finish_reason")]
    assert reasons == ["dead_end"]


@pytest.mark.parametrize("field", ["content", "stop", "prompt"])
def test_lone_surrogate_is_400_and_the_connection_stays_open(server, field):
    if field == "prompt":
        path, raw = "/v1/completions", '{"prompt": "a\\ud800", "max_tokens": 2}'
    elif field == "stop":
        path, raw = "/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "stop": ["\\udc00"], "max_tokens": 2}'
    else:
        path, raw = "/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi \\ud800"}], "max_tokens": 2}'
    with httpx.Client(base_url=server.url, timeout=300) as c:
        r = c.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert "surrogate" in r.json()["error"]["message"] and r.headers.get("connection") != "close"
        assert c.post("/v1/chat/completions", json=_chat(max_tokens=2)).status_code == 200


def test_prompt_tokens_count_once_per_request(http):
    before = _metric(http, "formcast_prompt_tokens_total")
    r = http.post("/v1/chat/completions", json=_chat(n=3, max_tokens=2, temperature=0.7, seed=1))
    assert r.status_code == 200
    usage = r.json()["usage"]
    assert _metric(http, "formcast_prompt_tokens_total") - before == usage["prompt_tokens"]


def test_a_client_leaving_mid_upload_is_not_a_400(server, http):
    before = _metric(http, "formcast_request_errors_total", '{status="400"}')
    host, port = server.url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"messages\": [")
    for _ in range(20):  # let the server notice the disconnect
        time.sleep(0.1)
        http.get("/health")
    assert _metric(http, "formcast_request_errors_total", '{status="400"}') == before


def test_stream_aborted_at_shutdown_still_gets_its_usage(server, engine, http):
    body = _chat(max_tokens=200, ignore_eos=True, stream=True, stream_options={"include_usage": True})
    events: list[str] = []
    with http.stream("POST", "/v1/chat/completions", json=body) as s:
        for line in s.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3:  # running: pretend the shutdown grace period is over
                    server.state.draining = True
                    server.state.abort_all()
    server.state.draining = False
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    usage = json.loads(events[-3])
    assert error["error"]["code"] == "shutting_down"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"min_tokens": 10**12}, "min_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_tokens"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True}, "continue_final_message"),
        ({"logit_bias": {"99999999": 5}}, "logit_bias"),
        ({"reasoning_efort": "low"}, "reasoning_efort"),
    ],
)
def test_lax_validation_is_now_a_clear_400(http, fields, param):
    r = http.post("/v1/chat/completions", json=_chat(**fields))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and param in error["message"]


def test_infinite_temperature_is_400(http):
    raw = '{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}'
    r = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]


def test_engine_refuses_min_tokens_beyond_the_context(engine):
    with pytest.raises(InvalidSamplingParams, match="min_new_tokens"):
        engine.generate("hi", {"min_new_tokens": 10**12, "max_new_tokens": None})


# --- section 1: fields clients send -----------------------------------------------------------


def test_client_fields_are_honoured(http):
    fields = {"user": "u1", "metadata": {"k": "v"}, "store": True, "parallel_tool_calls": True, "reasoning_effort": "low",
              "chat_template_kwargs": {"enable_thinking": False}, "max_completion_tokens": 3}  # fmt: skip
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
                {"role": "user", "content": "Count"}]  # fmt: skip
    r = http.post("/v1/chat/completions", json=_chat(messages=messages, **fields))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 3


@pytest.mark.parametrize("whitespace", ["compact", "pretty"])
def test_json_whitespace_over_http(http, whitespace):
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}  # fmt: skip
    rf = {"type": "json_schema", "json_schema": {"name": "ab", "schema": schema}}
    r = http.post("/v1/chat/completions", json=_chat(response_format=rf, json_whitespace=whitespace, max_tokens=40))
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    value = json.loads(text)
    assert text == json.dumps(value, separators=(",", ":")) if whitespace == "compact" else text == json.dumps(value, indent=2), text


def test_continuous_usage_stats(http):
    body = _chat(max_tokens=4, ignore_eos=True, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    with http.stream("POST", "/v1/chat/completions", json=body) as s:
        chunks = [json.loads(e) for e in _events(s)[:-1]]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert all("usage" in c for c in chunks) and counts == sorted(counts) and counts[-1] == 4


def test_continue_final_message_continues_the_prefix(engine, http):
    messages = [{"role": "user", "content": "Say a greeting."}, {"role": "assistant", "content": "Hello and"}]
    r = http.post("/v1/chat/completions", json=_chat(messages=messages, continue_final_message=True, max_tokens=4))
    assert r.status_code == 200, r.text
    ids = engine.apply_chat_template(messages, continue_final_message=True)
    text = engine.tokenizer.decode(ids)
    assert text.rstrip().endswith("Hello and")


def test_logit_bias_steers_within_the_constraint(engine, http):
    token = engine.tokenizer.encode(" banana", add_special_tokens=False)[0]
    r = http.post("/v1/completions", json={"prompt": "My favourite fruit is", "max_tokens": 1, "temperature": 0, "logit_bias": {str(token): 100}})
    assert r.json()["choices"][0]["text"] == engine.tokenizer.decode([token])
    r = http.post("/v1/chat/completions", json=_chat(regex="[0-9]{2}", logit_bias={str(token): 100}))
    assert re.fullmatch("[0-9]{2}", r.json()["choices"][0]["message"]["content"])


def test_hidden_states_over_http_and_from_the_engine(engine, http):
    r = http.post("/v1/completions", json={"prompt": "One two", "max_tokens": 3, "temperature": 0, "ignore_eos": True, "return_hidden_states": True})
    assert r.status_code == 200, r.text
    hidden = r.json()["choices"][0]["hidden_states"]
    assert len(hidden) == 3 and len(hidden[0]) == engine.runner.model_config.hidden_size if hasattr(engine.runner, "model_config") else len(hidden) == 3
    out = engine.generate("One two", {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}, return_hidden_states=True)
    assert len(out["meta_info"]["hidden_states"]) == 2
    plain = http.post("/v1/completions", json={"prompt": "One two", "max_tokens": 1}).json()
    assert "hidden_states" not in plain["choices"][0]


def test_no_stop_trim(http):
    base = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 12, "temperature": 0, "stop": [" 7"]}
    trimmed = http.post("/v1/completions", json=base).json()["choices"][0]
    kept = http.post("/v1/completions", json={**base, "no_stop_trim": True}).json()["choices"][0]
    assert trimmed["finish_reason"] == "stop" and kept["text"] == trimmed["text"] + " 7"


# --- section 3: what one request may ask for ---------------------------------------------------


def test_one_request_cannot_reserve_more_than_the_kv_pool(engine, http):
    pool = engine.runner.max_total_tokens
    r = http.post("/v1/chat/completions", json=_chat(n=100, max_tokens=pool // 50))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text


def test_the_waiting_queue_is_bounded_by_default(server, engine):
    assert server.app.state.serving_config.max_waiting_requests == 16 * engine.args.max_running_requests


# --- native routes ----------------------------------------------------------------------------


def test_tokenize_and_detokenize_round_trip(engine, http):
    r = http.post("/v1/tokenize", json={"prompt": "Hello world", "add_special_tokens": False}).json()
    assert r["tokens"] == engine.tokenizer.encode("Hello world", add_special_tokens=False) and r["count"] == len(r["tokens"])
    assert http.post("/v1/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "Hello world"}
    chat = http.post("/v1/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["tokens"] == engine.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert http.post("/v1/detokenize", json={"tokens": [10**9]}).status_code == 400


def test_native_generate_takes_sampling_params_as_is(http):
    body = {"text": "Pick a digit:", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "regex": "[0-9]"}}
    out = http.post("/generate", json=body).json()
    assert re.fullmatch("[0-9]", out["text"]) and out["meta_info"]["finish_reason"]["type"] == "stop"
    with http.stream("POST", "/generate", json={**body, "stream": True}) as s:
        events = _events(s)
    assert events[-1] == "[DONE]" and "".join(json.loads(e)["text"] for e in events[:-1]) == out["text"]
    bad = http.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokenz": 3}})
    assert bad.status_code == 400 and "max_new_tokenz" in bad.json()["error"]["message"]


STAMPED = {"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"}},
           "required": ["at", "id"], "additionalProperties": False}  # fmt: skip


def test_a_budget_below_the_shortest_output_is_refused_at_admission(engine, http):
    # The count is taken by the compile worker, before the grammar is shared; the server and the
    # scheduler only read it (computed on a grammar in use, it made JSON requests hang).
    from engine.constrained.output_budget import min_output_tokens

    need = min_output_tokens(engine.grammar_backend.compile(SamplingParams(json_schema=STAMPED)))
    assert isinstance(need, int) and 40 < need < 100
    fmt = {"type": "json_schema", "json_schema": {"name": "stamped", "schema": STAMPED}}
    r = http.post("/v1/chat/completions", json=_chat(response_format=fmt, max_tokens=need - 1))
    assert r.status_code == 400 and str(need) in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] in ("max_tokens", "max_new_tokens")
    # JSON requests at the same time all complete, each valid.
    results: list = []

    def ask(body: dict) -> None:
        results.append(http.post("/v1/chat/completions", json=body))

    small = {"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL}}
    threads = [threading.Thread(target=ask, args=(_chat(response_format=small, max_tokens=12),)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert [x.status_code for x in results] == [200] * 3, [x.text for x in results]
    for x in results:
        jsonschema.validate(json.loads(x.json()["choices"][0]["message"]["content"]), SMALL)
    # The Engine (scheduler) refuses it too, naming the minimum.
    out = engine.generate("Stamp it.", {"json_schema": STAMPED, "max_new_tokens": need - 1, "temperature": 0})
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and str(need) in out["meta_info"]["finish_reason"]["message"]


def test_choice_and_stop_regex(engine, http):
    picked = http.post("/v1/chat/completions", json=_chat(choice=["yes", "no", "maybe not"], max_tokens=6))
    assert picked.status_code == 200 and picked.json()["choices"][0]["message"]["content"] in ("yes", "no", "maybe not"), picked.text
    ask = _chat(messages=[{"role": "user", "content": "Describe the sea in two sentences."}], max_tokens=24)
    free = http.post("/v1/chat/completions", json=ask).json()["choices"][0]["message"]["content"]
    match = re.search(r"[.,!?]", free)
    assert match, free  # greedy SmolLM2 writes punctuation within 24 tokens
    cut = http.post("/v1/chat/completions", json={**ask, "stop_regex": [r"[.,!?]"]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["message"]["content"] == free[: match.start()], cut
    kept = engine.generate(engine.apply_chat_template(ask["messages"]), {"max_new_tokens": 24, "temperature": 0, "stop_regex": r"[.,!?]", "no_stop_trim": True})
    assert kept["text"] == free[: match.end()] and kept["meta_info"]["finish_reason"] == {"type": "stop", "matched": match.group(0)}
    for fields, param in (({"stop_regex": "("}, "stop_regex"), ({"stop_regex": "a*"}, "stop_regex"), ({"choice": []}, "choice")):
        r = http.post("/v1/chat/completions", json=_chat(**fields))
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_draining_answers_503_on_open_connections_then_exits(engine):
    srv = ServerThread(engine, shutdown_timeout=3)
    try:
        with httpx.Client(base_url=srv.url, timeout=300) as c:
            assert c.get("/health").status_code == 200  # the connection is now open (keep-alive)
            body = _chat(max_tokens=500, ignore_eos=True, stream=True)
            with httpx.Client(base_url=srv.url, timeout=300) as other, other.stream("POST", "/v1/chat/completions", json=body) as s:
                lines = s.iter_lines()
                next(line for line in lines if line.startswith("data: "))  # running
                srv.server.handle_exit(2, None)
                for _ in range(100):
                    if srv.state.draining:
                        break
                    time.sleep(0.02)
                assert c.get("/health").status_code == 503
                refused = c.post("/v1/chat/completions", json=_chat(max_tokens=2))
                assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
                rest = [line[6:] for line in lines if line.startswith("data: ")]
            assert rest[-1] == "[DONE]" and json.loads(rest[-2])["error"]["code"] == "shutting_down"  # aborted at the grace period
        srv.thread.join(60)
        assert not srv.thread.is_alive()
    finally:
        if srv.thread.is_alive():
            srv.stop()
