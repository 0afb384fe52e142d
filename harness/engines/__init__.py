"""The engines the tests and the benchmarks run: where their virtualenvs are (``venv``) and where an engine
process may write (``sandbox``); real vLLM engines (``vllm_real``, hybrid models ``vllm_hybrid``), vLLM's
scheduler and workers driving the connector in-process (``vllm_env``), small transformers models (``tiny``); real
SGLang servers (``sglang_real``) and the CPU kernels their engine path misses (``sglang_cpu_shim/``, put on the
server's ``PYTHONPATH``).

``scripts/`` holds what an engine's own python runs as a file (``vllm_engine.py``, ``sglang_model.py``). Python
puts a script's folder first on ``sys.path``, so they have a folder of their own: here, ``venv.py`` would stand in
for the standard library's ``venv`` in the engine's process.
"""
