"""`vpo compare`, the main job: its config and arms (`config`), the stages (`driver`) and the
report (`report`)."""
