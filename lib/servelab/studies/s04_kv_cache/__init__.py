"""Study 4: what a KV cache costs, measured on the engine's paged cache (``servelab.kv``).

``bytes_per_token`` (F4.1), ``capacity``, ``decode_scaling`` (F4.2), ``compaction_bench`` (F4.3), ``overlap`` and
``overlap_probes`` (F4.4); ``run`` the study, ``verdicts``, ``report`` (the page's takeaways), ``plots``, ``params``.
"""
