"""Click commands: thin, they parse, call the core and render."""
