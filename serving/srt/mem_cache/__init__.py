"""SGLang's KV memory, with SGLang's names: the request-to-token table and the token-to-KV pool
(``memory_pool``), the slot allocators (``allocator``) and the radix prefix cache
(``radix_cache``). SGLang's module paths (``sglang.srt.mem_cache.*``) resolve here through the
alias table, so a vendor platform that returns SGLang's stock classes gets these."""
