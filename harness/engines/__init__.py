"""Where the real engines live (``venv``) and where an engine process may write (``sandbox``)."""
