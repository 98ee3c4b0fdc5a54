"""``pagesim serve``: the simulator's replica model behind vLLM's HTTP API, against the wall clock.

- ``clock``: the SimPy replicas run in real time on the server's event loop (arrivals in, tokens out);
- ``openai_api``: vLLM 0.33's request bodies, errors, chunks and responses;
- ``app``: the FastAPI routes;
- ``metrics``: ``/metrics`` under vLLM's Prometheus names;
- ``lengths``: output lengths of requests that honour EOS;
- ``cli``: the command.

Nothing in the policy or the cost model knows whether time is simulated or real.
"""
