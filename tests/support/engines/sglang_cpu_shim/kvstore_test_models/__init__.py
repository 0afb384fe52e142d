"""The model families the engine tests serve, as an external model package (``SGLANG_EXTERNAL_MODEL_PACKAGE``).

SGLang then registers these few architectures instead of importing every model module it ships at start,
which takes minutes on a small CPU machine.
"""
