"""`moert serve`: an OpenAI-compatible HTTP server over one loaded Model.

    server.py       the engine: one model, requests in arrival order, one at a time or -np N at once
    slots.py        -np N: N slots generating at once, their tokens decoded together (moert/batch.py)
    idle.py         an idle server's Ray workers stop spinning (their compiled graph released)
    openai_api.py   a request read and its answer written, as OpenAI and llama.cpp's server shape them
    app.py          the FastAPI routes: OpenAI's API, llama.cpp server's endpoints, moert's own

A wing above the runtime: it imports moert.model's public interface, moert/text/ and moert/batch.py; the runtime
imports nothing from here.
"""
