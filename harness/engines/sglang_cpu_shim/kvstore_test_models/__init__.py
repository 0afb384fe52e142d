"""The model family the engine tests serve (Llama), as an external model package (``SGLANG_EXTERNAL_MODEL_PACKAGE``).

SGLang then registers this architecture instead of importing every model module it ships at start,
which takes minutes on a small CPU machine.
"""
