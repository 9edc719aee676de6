"""Every byte that leaves a process: messages, the msgpack codec, error codes, the log format."""
