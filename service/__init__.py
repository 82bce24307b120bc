"""What the CLI and the Discord bot both call: submit, cancel, status views, sweeps, instances, the git
trigger, embedded Redis."""
