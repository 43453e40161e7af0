"""Agent frameworks against ``formcast serve``, each connected the way its documentation
connects to an OpenAI-compatible endpoint (a base URL and a dummy key): LangChain
(``langchain-openai``), instructor, pydantic-ai and the OpenAI Agents SDK.

One ``formcast serve`` subprocess for the module (a free port, the embedded SmolLM2); small
schemas and token budgets keep each call to a few dozen tokens. What is checked is what the
frameworks hand their users: validated objects and tool calls whose arguments parse.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MODEL = "SmolLM2-135M-Instruct"


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=99)


class Weather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(max_length=12)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path_factory, *extra: str):
    """``formcast serve`` on a free port with ``extra`` options; yields its /v1 base URL."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    log = open(log_path, "w")  # a file, not a pipe: a full pipe would block the server's logging
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--port", str(port), "--dtype", "float32", "--max-total-tokens", "6000",
         "--num-threads", "1", "--no-access-log", "--log-level", "warning", *extra],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1800):
            if proc.poll() is not None:
                raise AssertionError(f"formcast serve exited: {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield url + "/v1"
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
        print(log_path.read_text()[-5000:])  # shown with -s or on failure: the server's side


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    yield from _serve(tmp_path_factory)


@pytest.fixture(scope="module")
def reasoning_url(tmp_path_factory):
    # SmolLM2 does not think, but with a reasoning parser everything before "</think>" is its
    # reasoning: a thinking budget makes the engine close the block, and the constraint (a
    # response_format, a forced tool) applies from there on, as with Qwen3 or DeepSeek-R1.
    yield from _serve(tmp_path_factory, "--reasoning-parser", "qwen3")


# --- LangChain --------------------------------------------------------------------------------


def _langchain(base_url: str, **kw):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(base_url=base_url, api_key="unused", model=MODEL, temperature=0, max_retries=0, **kw)


def test_langchain_structured_output_json_schema(base_url):
    llm = _langchain(base_url, max_tokens=40)
    person = llm.with_structured_output(Person, method="json_schema").invoke("Invent a person.")
    assert isinstance(person, Person)
    chunks = list(llm.with_structured_output(Person, method="json_schema").stream("Invent a person."))
    assert chunks and isinstance(chunks[-1], Person)


def test_langchain_bind_tools_forced_and_auto(base_url):
    llm = _langchain(base_url, max_tokens=40)
    forced = llm.bind_tools([Weather], tool_choice="Weather").invoke("What is the weather in Paris?")
    assert forced.tool_calls and forced.tool_calls[0]["name"] == "Weather"
    Weather.model_validate(forced.tool_calls[0]["args"])
    auto = llm.bind_tools([Weather]).invoke("What is the weather in Paris?")  # tool_choice auto
    for call in auto.tool_calls:  # the model may answer in text; a call it makes is valid
        Weather.model_validate(call["args"])
    streamed = None
    for chunk in llm.bind_tools([Weather], tool_choice="Weather").stream("Weather in Rome?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed.tool_calls and streamed.tool_calls[0]["name"] == "Weather"
    Weather.model_validate(streamed.tool_calls[0]["args"])


def test_langchain_auto_tools_streamed_equal_the_whole_answer(base_url):
    llm = _langchain(base_url, max_tokens=40).bind_tools([Weather])  # tool_choice auto
    whole = llm.invoke("What is the weather in Paris?")
    streamed = None
    for chunk in llm.stream("What is the weather in Paris?"):
        streamed = chunk if streamed is None else streamed + chunk
    # Greedy: the streamed deltas add up to the same text and the same calls, valid ones.
    assert streamed.content == whole.content
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls]
    for call in streamed.tool_calls:
        Weather.model_validate(call["args"])


def test_langchain_multi_turn_tool_result(base_url):
    messages = pytest.importorskip("langchain_core.messages")
    llm = _langchain(base_url, max_tokens=20)
    call = llm.bind_tools([Weather], tool_choice="Weather").invoke("Weather in Oslo?")
    history = [messages.HumanMessage("Weather in Oslo?"), call,
               messages.ToolMessage("12 C and raining", tool_call_id=call.tool_calls[0]["id"])]  # fmt: skip
    answer = llm.invoke(history)
    assert isinstance(answer.content, str) and answer.response_metadata["finish_reason"] in ("stop", "length")


# --- instructor -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
def test_instructor(base_url, mode):
    instructor = pytest.importorskip("instructor")
    import openai

    client = instructor.from_openai(openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300), mode=getattr(instructor.Mode, mode))
    person = client.chat.completions.create(
        model=MODEL, response_model=Person, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=40, temperature=0, max_retries=1
    )
    assert isinstance(person, Person)


# --- pydantic-ai ------------------------------------------------------------------------------


def test_pydantic_ai_output_type(base_url):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=base_url, api_key="unused"))
    agent = Agent(model, output_type=Person, model_settings={"max_tokens": 60, "temperature": 0})
    assert isinstance(agent.run_sync("Invent a person.").output, Person)

    async def streamed() -> Person:
        async with agent.run_stream("Invent a person.") as run:
            return await run.get_output()

    assert isinstance(asyncio.run(streamed()), Person)


# --- OpenAI Agents SDK ------------------------------------------------------------------------


def test_openai_agents_sdk_output_type(base_url):
    agents = pytest.importorskip("agents")
    import openai

    agents.set_tracing_disabled(True)

    def agent() -> object:
        # A client per event loop: an AsyncOpenAI client's connections belong to the loop that
        # opened them, and each asyncio.run below starts a new loop.
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
        return agents.Agent(
            name="inventor",
            instructions="You invent people.",
            model=agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
            output_type=Person,
            model_settings=agents.ModelSettings(max_tokens=60, temperature=0),
        )

    result = asyncio.run(agents.Runner.run(agent(), "Invent a person."))
    assert isinstance(result.final_output, Person)

    async def streamed() -> Person:
        run = agents.Runner.run_streamed(agent(), "Invent a person.")
        async for _ in run.stream_events():
            pass
        return run.final_output

    assert isinstance(asyncio.run(streamed()), Person)


# --- reasoning (a thinking budget, then the constraint) ---------------------------------------

BUDGET = {"max_reasoning_tokens": 4}


def test_reasoning_then_structured_output_through_langchain(reasoning_url):
    llm = _langchain(reasoning_url, max_tokens=60, extra_body=BUDGET)
    person = llm.with_structured_output(Person, method="json_schema").invoke("Invent a person.")
    assert isinstance(person, Person)
    call = llm.bind_tools([Weather], tool_choice="Weather").invoke("What is the weather in Paris?")
    assert call.tool_calls and call.tool_calls[0]["name"] == "Weather"
    Weather.model_validate(call.tool_calls[0]["args"])


def test_reasoning_content_apart_from_the_answer_streamed_or_not(reasoning_url):
    import openai

    client = openai.OpenAI(base_url=reasoning_url, api_key="unused", max_retries=0, timeout=300)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=60, temperature=0,
               response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": Person.model_json_schema()}},
               extra_body=BUDGET)  # fmt: skip
    whole = client.chat.completions.create(**ask)
    message = whole.choices[0].message
    thought = (message.model_extra or {}).get("reasoning_content")
    assert thought and "</think>" not in message.content and whole.choices[0].finish_reason == "stop"
    Person.model_validate_json(message.content)
    thoughts, answer = "", ""
    for chunk in client.chat.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            thoughts += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            answer += choice.delta.content or ""
    assert (thoughts, answer) == (thought, message.content)
