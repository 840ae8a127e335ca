"""Models and their tokenizers: names → local folders (:mod:`.catalog`), the built-in model's name
(:mod:`.builtin`), tokenizer loading (:mod:`.tokenizer`)."""
