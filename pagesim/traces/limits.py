"""The longest prompt or output pagesim makes a request with, or takes from a benchmark dataset or
an inference-perf config: ``MAX_LENGTH_TOKENS``.

Generators (``pagesim.traces.generate``) refuse a length distribution that reaches past it and cut
an unbounded lognormal at it; dataset readers (``pagesim.traces.bench``) and inference-perf
configs (``pagesim.traces.inference_perf``) refuse a token count past it. So none of them gives a
request a length no model could take.
"""

#: Past any model's context (Llama 4 Scout's is 10M tokens), and small enough that a sum over a
#: trace's lengths stays far inside int64.
MAX_LENGTH_TOKENS = 2**24
