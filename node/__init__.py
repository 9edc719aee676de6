"""The node as a whole: the supervisor and its restart policy, the client, the CLI, and a
node run locally with its crash check, for tests and scripts. The front door is an actor:
``actors/front_door.py``."""
