"""The engine connectors, imported as ``kvstore.connectors.<engine>``; their sources live in the top-level connectors/.

In a checkout (``PYTHONPATH=<checkout>`` or an editable install) this package's ``__path__`` is extended to
``<checkout>/connectors``, so ``kvstore.connectors.vllm`` is ``connectors/vllm/__init__.py``. A wheel installs
the same subpackages under ``kvstore/connectors/`` (setup.py maps them there), where the folder named below does
not exist and nothing is added. Users' engine configs keep ``kv_connector_module_path = "kvstore.connectors.vllm"``.
See docs/design/decisions.md ("connectors/ at the top level").
"""

from __future__ import annotations

import os

_SOURCE_TREE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "connectors")

if os.path.isfile(os.path.join(_SOURCE_TREE, "common", "__init__.py")):
    __path__.append(_SOURCE_TREE)
