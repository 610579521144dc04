"""The host side of an RL run around the jitted step of `vpo.rl`: grain data (`data`), the loop
with checkpoints and exact resume (`loop`), the step's compiled programs shared by the runs of
one process (`programs`), the run folder and who may write it (`run_folder`), metric and sample
logs (`metrics_log`, `samples_log`), stop signals and the skipped-update guard (`stopping`),
signs that a run is not learning (`watch`)."""
