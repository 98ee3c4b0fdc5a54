"""The command layer's policy glue: ``pagesim memory`` and ``pagesim presets``, and the policy
flags that ``simulate``, ``replay``, ``run`` and ``validate`` share. Above the policy, the catalog
and the simulator; nothing below imports it."""
