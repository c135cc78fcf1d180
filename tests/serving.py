"""A moert server in this process for the serve tests: uvicorn on 127.0.0.1 (a free port) in a thread, and an
OpenAI client for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PROMPTS = ["The capital of France is", "Once upon a time", "def main():", "1, 2, 3,", "Hello, my name is",
           "In the beginning", "The quick brown fox", "Dear Sir or Madam,"]   # the serve tests' prompts


@contextmanager
def running(server, log: Callable[[str], None] | None = None, metrics: bool = True) -> Iterator[str]:
    """Serve `server` (a moert.serve.server.Server) until the block ends; yields its base URL."""
    import uvicorn

    from moert.serve.app import create_app
    from moert.serve.server import listen

    sock = listen("127.0.0.1", 0)
    web = uvicorn.Server(uvicorn.Config(create_app(server, log=log or (lambda line: None), metrics=metrics),
                                        log_level="warning"))
    thread = threading.Thread(target=web.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    for _ in range(200):
        if web.started:
            break
        time.sleep(0.05)
    assert web.started
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        web.should_exit = True
        thread.join(timeout=10)


def client(url: str, timeout: float = 60):
    """The openai client for a moert server's /v1 routes."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=timeout)
