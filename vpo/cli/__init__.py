"""The `vpo` command: parser and training commands (`main`), the commands that read a policy
(`policy`), argument checks (`arguments`)."""
