"""`vpo compare`, the main job: its config and arms (`config`), the stages (`driver`, with the
pilot gate in `gate`, the RL arms in `arms` and what `--resume` reads back in `resume`) and the
report (`report`: its numbers in `numbers`, its text in `render`, its PNGs in `figures`)."""
