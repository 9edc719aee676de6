"""One module per actor, the Actor base, and the I/O-free state machines the actors run."""
