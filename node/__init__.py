"""The node as a whole: supervisor, front door, client, CLI."""
