"""The model catalog: shapes of public models (``models``), what they cost per token and in weights
(``model``, ``params``), how their KV cache is laid out in layer groups (``kv_layout``), and finding
one by the name people type or a Hugging Face ``config.json`` (``lookup``, ``hf_config``). Pure
Python: the policy, the simulator and the engine all read it."""
