"""The ``kvstore`` command: one module per subcommand."""
