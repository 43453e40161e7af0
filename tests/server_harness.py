"""A real server on 127.0.0.1 for the server tests: uvicorn in a thread with its own event loop."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import openai

from engine import Engine
from engine.entrypoints.http_server import ServerSettings, make_server


class ServerThread:
    """A server on 127.0.0.1 (a free port) running in a thread with its own event loop."""

    def __init__(self, engine: Engine, **settings) -> None:
        self.server = make_server(engine, ServerSettings(port=0, log_level="warning", access_log=False, **settings))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)
        self.thread.start()
        for _ in range(600):
            if self.server.started:
                break
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.app = self.server.config.app
        self.state = self.app.state.server

    def client(self, api_key: str = "unused", **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=300, **kwargs)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def stop(self) -> None:
        self.server.handle_exit(signal.SIGTERM, None)
        self.thread.join(60)
        assert not self.thread.is_alive()
