"""The ``tessera`` command: one entry point for every process and tool."""
