"""What the engine connectors share: chunk layout, model families, the store client, transfers, reports."""
